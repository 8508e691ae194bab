#!/usr/bin/env bash
# Generate TEST ONLY placeholder certificates for the demo agents (scott, john):
# a throwaway CA and one S/MIME-style leaf certificate per agent (e-mail in subject and SAN).
#
#   scripts/gen-placeholder-certs.sh [--out DIR] [--update-ldif]
#
# Writes under DIR (default: <repo>/certs):
#   ca.pem ca.der ca.key.pem                      the TEST ONLY CA
#   <agent>.pem <agent>.der <agent>.key.pem        each agent's certificate and private key
# With --update-ldif it also rewrites the userCertificate;binary values of uid=<agent>
# in ldap-fixtures/directory.ldif with the new DER certificates (base64, folded at 76).
# Nothing here is secret: the keys are placeholders and must never be used outside tests.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/certs"
update_ldif=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --update-ldif) update_ldif=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

days=3650
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -subj "/O=aqgate TEST ONLY/CN=aqgate TEST ONLY placeholder CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$out/ca.key.pem" -out "$out/ca.pem" 2>/dev/null
openssl x509 -in "$out/ca.pem" -outform DER -out "$out/ca.der"

agents=(scott john)
for agent in "${agents[@]}"; do
    mail="$agent@example.com"
    openssl req -newkey rsa:2048 -nodes -sha256 \
        -subj "/O=aqgate TEST ONLY/CN=$agent/emailAddress=$mail" \
        -keyout "$out/$agent.key.pem" -out "$tmp/$agent.csr" 2>/dev/null
    cat > "$tmp/$agent.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=emailProtection
subjectAltName=email:$mail
EXT
    openssl x509 -req -in "$tmp/$agent.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key.pem" -CAcreateserial \
        -CAserial "$tmp/ca.srl" -days "$days" -sha256 -extfile "$tmp/$agent.ext" -out "$out/$agent.pem" 2>/dev/null
    openssl x509 -in "$out/$agent.pem" -outform DER -out "$out/$agent.der"
    echo "$out/$agent.pem ($mail)"
done

if [ "$update_ldif" = 1 ]; then
    ldif="$repo/ldap-fixtures/directory.ldif"
    for agent in "${agents[@]}"; do
        b64="$(base64 -w0 "$out/$agent.der")"
        # Replace the (folded) userCertificate;binary value inside the entry "dn: uid=<agent>,...".
        awk -v uid="$agent" -v b64="$b64" '
            function emit(   first, rest) {
                first = "userCertificate;binary:: "; rest = b64
                printf "%s%s\n", first, substr(rest, 1, 76 - length(first)); rest = substr(rest, 77 - length(first))
                while (length(rest) > 0) { printf " %s\n", substr(rest, 1, 75); rest = substr(rest, 76) }
            }
            /^dn: / { inentry = (index($0, "dn: uid=" uid ",") == 1) }
            /^$/ { inentry = 0 }
            skipping && /^ / { next }
            { skipping = 0 }
            inentry && /^userCertificate;binary::/ { emit(); skipping = 1; next }
            { print }
        ' "$ldif" > "$tmp/directory.ldif"
        cat "$tmp/directory.ldif" > "$ldif"
    done
    echo "updated $ldif"
fi
