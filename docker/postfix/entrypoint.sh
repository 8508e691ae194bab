#!/usr/bin/env bash
# The postfix container of compose.yaml: deployment B of deploy/postfix/README.md. Renders
# deploy/postfix/{main.cf,master.cf} with scripts/postfix.sh (the same templates and the same
# rendering as the tests' private instances) into POSTFIX_DIR/etc and runs Postfix in the
# foreground (postfix start-fg, logging to stdout):
#   port 25     the public smtpd; every mail passes through aqgate (smtpd_proxy_filter) first
#   port 10026  the after-filter smtpd: aqgate reinjects mail for other recipients and sends
#               its replies and mailto: notifications here (clients in POSTFIX_MYNETWORKS only)
# Mail for POSTFIX_DOMAIN goes into Maildirs POSTFIX_DIR/maildir/<localpart>/.
#
#   POSTFIX_FILTER          aqgate's SMTP address (default aqgate:2525); empty: deployment A
#                           (no filter; Postfix only delivers and relays aqgate's replies)
#   POSTFIX_GATEWAY_DOMAIN  the domain of aqgate's gateway address (default aq.example.com)
#   POSTFIX_DOMAIN          the domain delivered into Maildirs (default example.com)
#   POSTFIX_MYNETWORKS      the clients trusted on port 10026 (default: the networks this
#                           container is attached to, as Postfix's mynetworks_style = subnet
#                           computes them: the compose network, where aqgate is)
#   POSTFIX_DIR             default /var/lib/aqgate-postfix
#   POSTFIX_SMTP_PORT, POSTFIX_REINJECT_PORT   default 25 and 10026
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
postfix_sh="$here/../../scripts/postfix.sh"
dir="${POSTFIX_DIR:-/var/lib/aqgate-postfix}"

nets="${POSTFIX_MYNETWORKS:-}"
if [ -z "$nets" ]; then
    tmp="$(mktemp -d)"
    printf 'compatibility_level = 3.6\ninet_protocols = ipv4\nmynetworks_style = subnet\n' > "$tmp/main.cf"
    : > "$tmp/master.cf"
    nets="$(postconf -c "$tmp" -h mynetworks)"
    rm -rf "$tmp"
fi

exec "$postfix_sh" run "$dir" \
    --listen 0.0.0.0 \
    --smtp-port "${POSTFIX_SMTP_PORT:-25}" --reinject-port "${POSTFIX_REINJECT_PORT:-10026}" \
    --mynetworks "$nets" \
    --log-file /dev/stdout \
    --filter "${POSTFIX_FILTER-aqgate:2525}" \
    --gateway-domain "${POSTFIX_GATEWAY_DOMAIN:-aq.example.com}" \
    --domain "${POSTFIX_DOMAIN:-example.com}"
