#!/usr/bin/env bash
# Generate the TEST ONLY client certificates for HTTPS client-certificate login, under their
# own CA (certs/client/), so that they never mix with the S/MIME certificates in certs/.
#
#   scripts/gen-client-certs.sh [--out DIR]
#
# Writes under DIR (default: <repo>/certs/client), each certificate as .pem, each key as .key.pem:
#   ca.*          "aqgate TEST ONLY client CA", self-signed
#   ca.crl        its CRL (PEM), listing revoked.pem, next update in 10 years
#   scott.*       email scott@example.com, clientAuth: logs in as scott (the directory's mail)
#   svc.*         CN=svc, no e-mail address, clientAuth: logs in only as an agent whose
#                 directory entry holds exactly this certificate
#   mallory.*     email mallory@example.com, clientAuth: no agent has that address
#   expired.*     scott@example.com, clientAuth, valid 2020-01-01 .. 2021-01-01 only
#   revoked.*     scott@example.com, clientAuth, revoked (keyCompromise) in ca.crl
#   wrong-eku.*   scott@example.com, extendedKeyUsage emailProtection only
#   no-eku.*      scott@example.com, no extendedKeyUsage at all
#   other-ca.*    a second CA, not trusted by the servlet
#   untrusted.*   scott@example.com, clientAuth, issued by other-ca
# The generated files are committed; tests never run this script. Nothing here is secret.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/certs/client"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ca() { # $1 = name, $2 = CN
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
        -subj "/O=aqgate TEST ONLY/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$out/$1.key.pem" -out "$out/$1.pem" 2>/dev/null
}
ca ca "aqgate TEST ONLY client CA"
ca other-ca "aqgate TEST ONLY other client CA"

mkdir -p "$tmp/newcerts"
: > "$tmp/index.txt"
conf() { # $1 = CA name
    cat <<CNF
[ ca ]
default_ca = testca
[ testca ]
database = $tmp/index.txt
new_certs_dir = $tmp/newcerts
certificate = $out/$1.pem
private_key = $out/$1.key.pem
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
rand_serial = yes
default_crl_days = 3650
crl_extensions = crl_ext
[ policy_any ]
organizationName = optional
commonName = supplied
[ crl_ext ]
authorityKeyIdentifier = keyid:always
CNF
}
conf ca > "$tmp/ca.cnf"
conf other-ca > "$tmp/other-ca.cnf"

# $1 = name, $2 = CN, $3 = e-mail ("" for none), $4 = extendedKeyUsage ("" for none),
# $5 = CA name, then extra `openssl ca` arguments.
issue() {
    local name="$1" cn="$2" email="$3" eku="$4" issuer="$5"
    shift 5
    {
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        [ -n "$eku" ] && echo "extendedKeyUsage=$eku"
        [ -n "$email" ] && echo "subjectAltName=email:$email"
        echo "subjectKeyIdentifier=hash"
        echo "authorityKeyIdentifier=keyid"
    } > "$tmp/$name.ext"
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/O=aqgate TEST ONLY/CN=$cn" \
        -keyout "$out/$name.key.pem" -out "$tmp/$name.csr" 2>/dev/null
    openssl ca -batch -config "$tmp/$issuer.cnf" -extfile "$tmp/$name.ext" -in "$tmp/$name.csr" \
        -out "$tmp/$name.crt" -notext "$@" 2>/dev/null
    openssl x509 -in "$tmp/$name.crt" -out "$out/$name.pem"
}
issue scott scott scott@example.com clientAuth ca -days 3650
issue svc svc "" clientAuth ca -days 3650
issue mallory mallory mallory@example.com clientAuth ca -days 3650
issue expired scott scott@example.com clientAuth ca -startdate 20200101000000Z -enddate 20210101000000Z
issue revoked scott scott@example.com clientAuth ca -days 3650
issue wrong-eku scott scott@example.com emailProtection ca -days 3650
issue no-eku scott scott@example.com "" ca -days 3650
issue untrusted scott scott@example.com clientAuth other-ca -days 3650
openssl ca -config "$tmp/ca.cnf" -revoke "$out/revoked.pem" -crl_reason keyCompromise 2>/dev/null
openssl ca -config "$tmp/ca.cnf" -gencrl -out "$out/ca.crl" 2>/dev/null
echo "client certificates written to $out"
