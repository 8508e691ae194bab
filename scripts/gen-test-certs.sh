#!/usr/bin/env bash
# Generate the TEST ONLY negative-case and gateway certificates for the S/MIME tests
# (src/mail/smime.rs), signed by the existing placeholder CA certs/ca.pem + certs/ca.key.pem
# (made by scripts/gen-placeholder-certs.sh, which owns ca.*, scott.*, john.*; this script
# never touches those, so ldap-fixtures/directory.ldif stays consistent).
#
#   scripts/gen-test-certs.sh [--out DIR]
#
# Writes under DIR (default: <repo>/certs), each certificate as .pem and .der, each key as .key.pem:
#   expired.*            scott@example.com, emailProtection, valid 2020-01-01 .. 2021-01-01 only
#   wrong-eku.*          scott@example.com, extendedKeyUsage=clientAuth (no emailProtection)
#   revoked.*            scott@example.com, emailProtection, revoked (keyCompromise) in ca.crl
#   ca.crl               the test CA's CRL (PEM), listing revoked.pem, next update in 10 years
#   other-ca.*           a second, untrusted self-signed CA ("aqgate TEST ONLY other CA")
#   other-ca-scott.*     scott@example.com, emailProtection, issued by other-ca (untrusted chain)
#   gateway-tls.*        the gateway's TLS server certificate: serverAuth, SAN localhost, 127.0.0.1
#   gateway-smime.*      the gateway's S/MIME certificate (aq@localhost, emailProtection): signs
#                        replies, and requests encrypted to it are decrypted with its key
#   scott-ec.*           scott@example.com, emailProtection, an EC P-256 key (ECDSA signatures)
#   scott-pss.*          scott@example.com, emailProtection, an RSASSA-PSS key (PSS signatures only)
#   sub-ca.*             an intermediate CA issued by the test CA ("aqgate TEST ONLY intermediate CA")
#   sub-ca-scott.*       scott@example.com, emailProtection, issued by the intermediate
#   sub-ca-revoked.*     scott@example.com, emailProtection, issued by the intermediate, revoked in sub-ca.crl
#   sub-ca.crl           the intermediate's CRL (PEM), listing sub-ca-revoked.pem, next update in 10 years
# The generated files are committed; tests never run this script. Nothing here is secret.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/certs"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }
for f in ca.pem ca.key.pem; do
    [ -f "$repo/certs/$f" ] || { echo "missing certs/$f: run scripts/gen-placeholder-certs.sh first" >&2; exit 1; }
done
mkdir -p "$out"
[ "$out/ca.pem" -ef "$repo/certs/ca.pem" ] || cp "$repo/certs/ca.pem" "$repo/certs/ca.key.pem" "$out/"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# A throwaway `openssl ca` database: needed for explicit start/end dates and for the CRL.
mkdir -p "$tmp/newcerts"
: > "$tmp/index.txt"
cat > "$tmp/ca.cnf" <<CNF
[ ca ]
default_ca = testca
[ testca ]
database = $tmp/index.txt
new_certs_dir = $tmp/newcerts
certificate = $out/ca.pem
private_key = $out/ca.key.pem
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
email_in_dn = yes
rand_serial = yes
default_crl_days = 3650
crl_extensions = crl_ext
[ policy_any ]
organizationName = optional
commonName = supplied
emailAddress = optional
[ crl_ext ]
authorityKeyIdentifier = keyid:always
CNF

smime_ext() { # $1 = extendedKeyUsage, $2 = keyUsage, $3 = e-mail address
    cat <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,${2:-digitalSignature,keyEncipherment}
extendedKeyUsage=$1
subjectAltName=email:${3:-scott@example.com}
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EXT
}

csr() { # $1 = name, $2 = CN; writes $out/$1.key.pem and $tmp/$1.csr for scott@example.com
    openssl req -newkey rsa:2048 -nodes -sha256 \
        -subj "/O=aqgate TEST ONLY/CN=$2/emailAddress=scott@example.com" \
        -keyout "$out/$1.key.pem" -out "$tmp/$1.csr" 2>/dev/null
}

ca_sign() { # $1 = name, $2 = extfile, rest = extra `openssl ca` arguments (dates); $cnf: which CA
    local name="$1" ext="$2"; shift 2
    openssl ca -batch -config "${cnf:-$tmp/ca.cnf}" -notext -preserveDN -in "$tmp/$name.csr" \
        -out "$out/$name.pem" -extfile "$ext" "$@" 2>/dev/null
    openssl x509 -in "$out/$name.pem" -outform DER -out "$out/$name.der"
    echo "$out/$name.pem"
}

# expired: valid only during 2020.
csr expired "scott (expired)"
smime_ext emailProtection > "$tmp/smime.ext"
ca_sign expired "$tmp/smime.ext" -startdate 20200101000000Z -enddate 20210101000000Z

# wrong EKU: clientAuth instead of emailProtection.
csr wrong-eku "scott (wrong EKU)"
smime_ext clientAuth > "$tmp/clientauth.ext"
ca_sign wrong-eku "$tmp/clientauth.ext" -days 3650

# revoked, and the CRL that says so.
csr revoked "scott (revoked)"
ca_sign revoked "$tmp/smime.ext" -days 3650
openssl ca -batch -config "$tmp/ca.cnf" -revoke "$out/revoked.pem" -crl_reason keyCompromise 2>/dev/null
openssl ca -batch -config "$tmp/ca.cnf" -gencrl -crldays 3650 -out "$out/ca.crl" 2>/dev/null
echo "$out/ca.crl"

# gateway TLS server certificate.
openssl req -newkey rsa:2048 -nodes -sha256 -subj "/O=aqgate TEST ONLY/CN=localhost" \
    -keyout "$out/gateway-tls.key.pem" -out "$tmp/gateway-tls.csr" 2>/dev/null
cat > "$tmp/tls.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EXT
ca_sign gateway-tls "$tmp/tls.ext" -days 3650

# A second CA that nobody trusts, and a scott certificate from it.
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -subj "/O=aqgate TEST ONLY/CN=aqgate TEST ONLY other CA (untrusted)" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$out/other-ca.key.pem" -out "$out/other-ca.pem" 2>/dev/null
openssl x509 -in "$out/other-ca.pem" -outform DER -out "$out/other-ca.der"
echo "$out/other-ca.pem"
csr other-ca-scott "scott (other CA)"
openssl x509 -req -in "$tmp/other-ca-scott.csr" -CA "$out/other-ca.pem" -CAkey "$out/other-ca.key.pem" \
    -CAcreateserial -CAserial "$tmp/other-ca.srl" -days 3650 -sha256 -extfile "$tmp/smime.ext" \
    -out "$out/other-ca-scott.pem" 2>/dev/null
openssl x509 -in "$out/other-ca-scott.pem" -outform DER -out "$out/other-ca-scott.der"
echo "$out/other-ca-scott.pem"

# The gateway's S/MIME certificate: aq@localhost, signs replies and decrypts requests.
openssl req -newkey rsa:2048 -nodes -sha256 \
    -subj "/O=aqgate TEST ONLY/CN=aqgate gateway/emailAddress=aq@localhost" \
    -keyout "$out/gateway-smime.key.pem" -out "$tmp/gateway-smime.csr" 2>/dev/null
smime_ext emailProtection digitalSignature,keyEncipherment aq@localhost > "$tmp/gateway-smime.ext"
ca_sign gateway-smime "$tmp/gateway-smime.ext" -days 3650

# scott with an EC P-256 key (ECDSA; key agreement for encryption to it).
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
    -subj "/O=aqgate TEST ONLY/CN=scott (EC)/emailAddress=scott@example.com" \
    -keyout "$out/scott-ec.key.pem" -out "$tmp/scott-ec.csr" 2>/dev/null
smime_ext emailProtection digitalSignature,keyAgreement > "$tmp/ec.ext"
ca_sign scott-ec "$tmp/ec.ext" -days 3650

# scott with an RSASSA-PSS key: whatever signs with it signs RSASSA-PSS.
openssl genpkey -algorithm RSA-PSS -pkeyopt rsa_keygen_bits:2048 -out "$out/scott-pss.key.pem" 2>/dev/null
openssl req -new -key "$out/scott-pss.key.pem" -sha256 \
    -subj "/O=aqgate TEST ONLY/CN=scott (RSASSA-PSS)/emailAddress=scott@example.com" -out "$tmp/scott-pss.csr"
smime_ext emailProtection digitalSignature > "$tmp/pss.ext"
ca_sign scott-pss "$tmp/pss.ext" -days 3650

# An intermediate CA under the test CA, with its own `openssl ca` database and CRL.
openssl req -newkey rsa:2048 -nodes -sha256 -subj "/O=aqgate TEST ONLY/CN=aqgate TEST ONLY intermediate CA" \
    -keyout "$out/sub-ca.key.pem" -out "$tmp/sub-ca.csr" 2>/dev/null
cat > "$tmp/sub-ca.ext" <<EXT
basicConstraints=critical,CA:TRUE,pathlen:0
keyUsage=critical,keyCertSign,cRLSign
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EXT
ca_sign sub-ca "$tmp/sub-ca.ext" -days 3650
mkdir -p "$tmp/sub/newcerts"
: > "$tmp/sub/index.txt"
sed -e "s#$tmp/index.txt#$tmp/sub/index.txt#" -e "s#$tmp/newcerts#$tmp/sub/newcerts#" \
    -e "s#$out/ca.pem#$out/sub-ca.pem#" -e "s#$out/ca.key.pem#$out/sub-ca.key.pem#" "$tmp/ca.cnf" > "$tmp/sub-ca.cnf"
csr sub-ca-scott "scott (intermediate CA)"
cnf="$tmp/sub-ca.cnf" ca_sign sub-ca-scott "$tmp/smime.ext" -days 3650
csr sub-ca-revoked "scott (intermediate CA, revoked)"
cnf="$tmp/sub-ca.cnf" ca_sign sub-ca-revoked "$tmp/smime.ext" -days 3650
openssl ca -batch -config "$tmp/sub-ca.cnf" -revoke "$out/sub-ca-revoked.pem" -crl_reason keyCompromise 2>/dev/null
openssl ca -batch -config "$tmp/sub-ca.cnf" -gencrl -crldays 3650 -out "$out/sub-ca.crl" 2>/dev/null
echo "$out/sub-ca.crl"
