#!/usr/bin/env bash
# A throwaway OpenLDAP server (Debian's slapd) loaded with the aqgate schema and directory.
#
#   scripts/slapd.sh start DIR [EXTRA.ldif ...]   start (or restart) the server kept in DIR; prints its ldap:// URL
#   scripts/slapd.sh stop DIR                     stop it (SIGTERM, then SIGKILL after 10 s); keeps DIR for a restart
#   scripts/slapd.sh status DIR                   exit 0 if it runs
#   scripts/slapd.sh init DIR [EXTRA.ldif ...]    only build DIR (config, data, TLS) if it is new; starts nothing
#   scripts/slapd.sh run DIR [EXTRA.ldif ...]     init, then run slapd in the foreground (exec, log on
#                                                 stderr): for a container (docker/slapd/)
#   scripts/slapd.sh check DIR                    exit 0 if it answers an authenticated search over StartTLS
#   scripts/slapd.sh install                      only install slapd + ldap-utils if missing
#
# The first start in an empty DIR builds a private cn=config (slapadd -n0) from
# ldap-fixtures/aqgate-schema.ldif, loads ldap-fixtures/directory.ldif (plus EXTRA.ldif files,
# in order) and picks a free port on 127.0.0.1. A later start in the same DIR reuses the
# config, the data and the ports (so a client can reconnect to the same URL).
# The server also speaks TLS: StartTLS on the ldap:// port, and ldaps:// on a second port,
# with a TEST ONLY server certificate for 127.0.0.1/localhost signed by DIR/tls/ca.pem.
# Files in DIR: url, ldaps_url, bind_dn, bind_password, tls/ca.pem, slapd.pid, slapd.log.
# Access: only authenticated users (the TEST ONLY rootdn in bind_dn/bind_password) may read.
# Installs slapd + ldap-utils (apt-get, non-interactive) if missing; never touches the
# system slapd's configuration.
# Environment (optional; unset, everything is as described above, which the tests use):
#   SLAPD_LISTEN      the address to listen on (default 127.0.0.1; 0.0.0.0: every address)
#   SLAPD_PORT, SLAPD_LDAPS_PORT   fixed ports instead of free ones
#   SLAPD_TLS_NAMES   more DNS names for the server certificate, comma-separated (when DIR is built)
#   SLAPD_TLS_DAYS    validity of the TEST ONLY CA and server certificate in days (default 30)
#   SLAPD_USER        run: slapd drops to this user and its group after binding its ports (DIR is
#                     given to them)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fixtures="$repo/ldap-fixtures"
base_dn="dc=aqgate,dc=example"
bind_dn="cn=admin,$base_dn"
bind_password="test-only-not-a-secret"
SLAPD=/usr/sbin/slapd
SLAPADD=/usr/sbin/slapadd

die() { echo "slapd.sh: $*" >&2; exit 1; }

ensure_installed() {
    if [ -x "$SLAPD" ] && command -v ldapsearch >/dev/null; then return; fi
    echo "slapd.sh: installing slapd and ldap-utils" >&2
    export DEBIAN_FRONTEND=noninteractive
    # Do not let the package start (or configure) a system-wide server.
    printf 'slapd slapd/no_configuration boolean true\n' | debconf-set-selections 2>/dev/null || true
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    # Tests start servers in parallel: one apt-get at a time (the others wait, then see it done).
    exec 9>/tmp/aqgate-apt.lock
    flock 9
    if [ -x "$SLAPD" ] && command -v ldapsearch >/dev/null; then exec 9>&-; return; fi
    $sudo apt-get update -qq >&2 || true
    $sudo apt-get install -y -qq slapd ldap-utils >&2
    exec 9>&-
    [ -x "$SLAPD" ] || die "slapd is not installed"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

listen="${SLAPD_LISTEN:-127.0.0.1}"
# The host in DIR/url: where a client on this machine reaches the server.
url_host="$listen"
[ "$listen" != 0.0.0.0 ] || url_host=127.0.0.1

free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$(( 20000 + RANDOM % 40000 ))
        if ! port_in_use "$p"; then echo "$p"; return; fi
    done
    die "no free port found"
}

running() {
    local dir="$1" pid
    [ -f "$dir/slapd.pid" ] || return 1
    pid="$(cat "$dir/slapd.pid")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

make_tls() {
    local tls="$1/tls"
    mkdir -p "$tls"
    local days="${SLAPD_TLS_DAYS:-30}" san="IP:127.0.0.1,DNS:localhost" names="${SLAPD_TLS_NAMES:-}" name
    case "$listen" in 127.0.0.1 | 0.0.0.0) ;; *) san="$san,IP:$listen" ;; esac
    for name in ${names//,/ }; do san="$san,DNS:$name"; done
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" -subj "/O=aqgate TEST ONLY/CN=slapd.sh test CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" \
        -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/O=aqgate TEST ONLY/CN=localhost" \
        -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
        "$san" > "$tls/server.ext"
    openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
        -CAserial "$tls/ca.srl" -days "$days" -sha256 -extfile "$tls/server.ext" -out "$tls/server.pem" 2>/dev/null
    chmod 600 "$tls/server.key" "$tls/ca.key"
}

build() {
    local dir="$1"; shift
    mkdir -p "$dir/slapd.d" "$dir/db"
    make_tls "$dir"
    cat > "$dir/config.ldif" <<CONF
dn: cn=config
objectClass: olcGlobal
cn: config
olcPidFile: $dir/slapd.pid
olcArgsFile: $dir/slapd.args
olcTLSCACertificateFile: $dir/tls/ca.pem
olcTLSCertificateFile: $dir/tls/server.pem
olcTLSCertificateKeyFile: $dir/tls/server.key

dn: cn=module{0},cn=config
objectClass: olcModuleList
cn: module{0}
olcModulePath: /usr/lib/ldap
olcModuleLoad: back_mdb

dn: cn=schema,cn=config
objectClass: olcSchemaConfig
cn: schema

include: file:///etc/ldap/schema/core.ldif
include: file:///etc/ldap/schema/cosine.ldif
include: file:///etc/ldap/schema/inetorgperson.ldif
include: file://$fixtures/aqgate-schema.ldif

dn: olcDatabase={-1}frontend,cn=config
objectClass: olcDatabaseConfig
objectClass: olcFrontendConfig
olcDatabase: {-1}frontend
olcAccess: {0}to dn.base="" by * read
olcAccess: {1}to dn.base="cn=Subschema" by * read

dn: olcDatabase={0}config,cn=config
objectClass: olcDatabaseConfig
olcDatabase: {0}config
olcAccess: {0}to * by * none

dn: olcDatabase={1}mdb,cn=config
objectClass: olcDatabaseConfig
objectClass: olcMdbConfig
olcDatabase: {1}mdb
olcSuffix: $base_dn
olcRootDN: $bind_dn
olcRootPW: $bind_password
olcDbDirectory: $dir/db
olcDbMaxSize: 67108864
olcDbIndex: objectClass eq
olcDbIndex: cn,uid,mail eq
olcAccess: {0}to * by users read by anonymous auth by * none
CONF
    $SLAPADD -q -n0 -F "$dir/slapd.d" -l "$dir/config.ldif" >"$dir/slapadd.log" 2>&1 \
        || { cat "$dir/slapadd.log" >&2; die "loading cn=config failed"; }
    local f
    for f in "$fixtures/directory.ldif" "$@"; do
        $SLAPADD -q -n1 -F "$dir/slapd.d" -l "$f" >>"$dir/slapadd.log" 2>&1 \
            || { cat "$dir/slapadd.log" >&2; die "loading $f failed"; }
    done
    printf '%s\n' "$bind_dn" > "$dir/bind_dn"
    (umask 077; printf '%s' "$bind_password" > "$dir/bind_password")
}

wait_ready() {
    local dir="$1" url
    url="$(cat "$dir/url")"
    for _ in $(seq 1 100); do
        if ldapsearch -x -H "$url" -D "$bind_dn" -y "$dir/bind_password" -b "$base_dn" -s base -LLL dn \
            >/dev/null 2>&1; then
            return 0
        fi
        running "$dir" || return 1
        sleep 0.1
    done
    return 1
}

start() {
    local dir="$1"; shift
    ensure_installed
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if running "$dir"; then cat "$dir/url"; return; fi
    [ -d "$dir/slapd.d" ] || build "$dir" "$@"
    local attempt port sport fresh=0
    [ -f "$dir/port" ] || fresh=1
    for attempt in 1 2 3 4 5; do
        if [ "$fresh" = 1 ]; then
            port="${SLAPD_PORT:-$(free_port)}"; sport="${SLAPD_LDAPS_PORT:-$(free_port)}"
            [ "$port" != "$sport" ] || continue
            echo "$port" > "$dir/port"; echo "$sport" > "$dir/sport"
        fi
        port="$(cat "$dir/port")"; sport="$(cat "$dir/sport")"
        echo "ldap://$url_host:$port" > "$dir/url"
        echo "ldaps://$url_host:$sport" > "$dir/ldaps_url"
        rm -f "$dir/slapd.pid"
        # Foreground (-d) in its own session, so its log goes to a file and it outlives this script.
        setsid "$SLAPD" -d stats -F "$dir/slapd.d" -h "ldap://$listen:$port/ ldaps://$listen:$sport/" \
            >"$dir/slapd.log" 2>&1 </dev/null &
        echo $! > "$dir/slapd.pid"
        if wait_ready "$dir"; then cat "$dir/url"; return; fi
        stop "$dir" >/dev/null 2>&1 || true
        if [ "$fresh" = 0 ]; then
            # The old ports may be taken (or still closing): wait a little and retry them.
            sleep 1
            [ "$attempt" -lt 5 ] || break
        fi
    done
    tail -n 20 "$dir/slapd.log" >&2 || true
    die "slapd did not start (see $dir/slapd.log)"
}

init() {
    local dir="$1"; shift
    ensure_installed
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    [ -d "$dir/slapd.d" ] || build "$dir" "$@"
}

run() {
    local dir="$1"; shift
    init "$dir" "$@"
    dir="$(cd "$dir" && pwd)"
    # No "already running" check: in a restarted container the old pid file names PID 1, us.
    local port sport
    port="${SLAPD_PORT:-$(cat "$dir/port" 2>/dev/null || free_port)}"
    sport="${SLAPD_LDAPS_PORT:-$(cat "$dir/sport" 2>/dev/null || free_port)}"
    echo "$port" > "$dir/port"; echo "$sport" > "$dir/sport"
    echo "ldap://$url_host:$port" > "$dir/url"
    echo "ldaps://$url_host:$sport" > "$dir/ldaps_url"
    rm -f "$dir/slapd.pid"
    local -a user=()
    if [ -n "${SLAPD_USER:-}" ]; then
        local group
        group="$(id -gn "$SLAPD_USER")"
        chown -R "$SLAPD_USER:$group" "$dir"
        user=(-u "$SLAPD_USER" -g "$group")
    fi
    echo "slapd.sh: serving $(cat "$dir/url") (StartTLS) and $(cat "$dir/ldaps_url")" >&2
    exec "$SLAPD" -d stats "${user[@]}" -F "$dir/slapd.d" -h "ldap://$listen:$port/ ldaps://$listen:$sport/"
}

check() {
    local dir="$1"
    [ -f "$dir/url" ] || return 1
    LDAPTLS_CACERT="$dir/tls/ca.pem" ldapsearch -x -ZZ -H "$(cat "$dir/url")" -D "$(cat "$dir/bind_dn")" \
        -y "$dir/bind_password" -b "$base_dn" -s base -LLL dn >/dev/null 2>&1
}

stop() {
    local dir="$1" pid
    [ -f "$dir/slapd.pid" ] || return 0
    pid="$(cat "$dir/slapd.pid")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.2; fi
    fi
    rm -f "$dir/slapd.pid"
}

cmd="${1:-}"
if [ "$cmd" = install ]; then ensure_installed; exit 0; fi
[ $# -ge 2 ] || { sed -n '2,29p' "$0" >&2; exit 2; }
shift
case "$cmd" in
    start) start "$@" ;;
    stop) stop "$1" ;;
    status) running "$1" ;;
    init) init "$@" ;;
    run) run "$@" ;;
    check) check "$1" ;;
    *) sed -n '2,29p' "$0" >&2; exit 2 ;;
esac
