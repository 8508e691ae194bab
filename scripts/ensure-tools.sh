#!/usr/bin/env bash
# Installs the tools the test suite drives (Debian packages): swaks (SMTP client, with TLS), gpgsm
# (a second S/MIME implementation), Debian's Python with python3-cryptography (a third: its
# PKCS#7 S/MIME builder), faketime (S/MIME signatures with a chosen signingTime), the openssl
# CLI, curl, haproxy (the load balancer of the multi-node crash test), and the headers the
# openssl crate builds against, libxmlsec1-dev and libclang-dev (aqgate-saml's samael builds against xmlsec1),
# xmlsec1 (tests/saml.rs signs its forgeries with it); sqlite3 and psql (the AQ$ views'
# test reads them as a user would); simplesamlphp + php-cli (a real SAML
# IdP; scripts/simplesamlphp.sh install); slapd and ldap-utils (scripts/slapd.sh install) and postfix (unconfigured:
# the tests run private instances; scripts/postfix.sh install), both called here.
# PostgreSQL comes from ensure-postgres.sh.
set -euo pipefail
need=()
command -v swaks >/dev/null 2>&1 || need+=(swaks)
command -v gpgsm >/dev/null 2>&1 || need+=(gpgsm)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v curl >/dev/null 2>&1 || need+=(curl)         # tests/https.rs: HTTP/2, client certificates
command -v faketime >/dev/null 2>&1 || need+=(faketime)   # S/MIME tests: signingTime
/usr/bin/python3 -c 'import cryptography' >/dev/null 2>&1 || need+=(python3 python3-cryptography)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)   # tests/crash.rs: several nodes behind it
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
dpkg -s libxmlsec1-dev >/dev/null 2>&1 || need+=(libxmlsec1-dev)   # aqgate-saml (samael links xmlsec1, libxml2)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)       # samael's build generates its xmlsec bindings
command -v xmlsec1 >/dev/null 2>&1 || need+=(xmlsec1)             # tests/saml.rs: an independent signer for forgeries
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)             # tests/aq_semantics.rs: the AQ$ views read by SQLite's shell
command -v psql >/dev/null 2>&1 || need+=(postgresql-client)      # and by psql
perl -MNet::SSLeay -e1 >/dev/null 2>&1 || need+=(libnet-ssleay-perl)   # swaks --tls
if [ ${#need[@]} -gt 0 ]; then
  echo "ensure-tools: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$(dirname "$0")/slapd.sh" install
"$(dirname "$0")/postfix.sh" install
"$(dirname "$0")/simplesamlphp.sh" install
echo "ensure-tools: ok"
