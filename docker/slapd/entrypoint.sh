#!/usr/bin/env bash
# The slapd container of compose.yaml. On its first start scripts/slapd.sh builds the server
# in SLAPD_DIR from ldap-fixtures/ (as for the tests: same schema, same data, same TEST ONLY
# rootdn and password), with a TEST ONLY CA made for this container; then it copies that CA's
# certificate to SLAPD_CA_EXPORT (a volume aqgate reads, to verify slapd over StartTLS) and
# runs slapd in the foreground. Arguments: more LDIF files to load on the first start.
#
#   SLAPD_DIR         the server's directory (default /var/lib/aqgate-ldap; its bind_dn,
#                     bind_password and tls/ca.pem are what a client needs)
#   SLAPD_CA_EXPORT   where to copy tls/ca.pem (e.g. /ldap-ca/ca.pem); unset: nowhere
#   SLAPD_*           the rest: see scripts/slapd.sh (the image sets them)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
slapd_sh="$here/../../scripts/slapd.sh"
dir="${SLAPD_DIR:-/var/lib/aqgate-ldap}"

"$slapd_sh" init "$dir" "$@"
if [ -n "${SLAPD_CA_EXPORT:-}" ]; then
    mkdir -p "$(dirname "$SLAPD_CA_EXPORT")"
    # Replace, never truncate in place: a reader sees the old file or the new one.
    cp "$dir/tls/ca.pem" "$SLAPD_CA_EXPORT.tmp"
    chmod 0644 "$SLAPD_CA_EXPORT.tmp"
    mv -f "$SLAPD_CA_EXPORT.tmp" "$SLAPD_CA_EXPORT"
fi
exec "$slapd_sh" run "$dir" "$@"
