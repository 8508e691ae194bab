#!/usr/bin/env bash
# A throwaway private Postfix instance for aqgate's deployments (deploy/postfix/README.md).
#
#   scripts/postfix.sh start DIR [OPTIONS]   start (or restart) the instance kept in DIR; prints its smtp host:port
#   scripts/postfix.sh stop DIR              stop it (postfix stop, then SIGKILL after 10 s); keeps DIR for a restart
#   scripts/postfix.sh status DIR            exit 0 if it runs
#   scripts/postfix.sh install               install Debian's postfix package if it is missing (nothing else)
#   scripts/postfix.sh run DIR [OPTIONS]     render as for start, then run Postfix in the foreground
#                                            (exec postfix start-fg): for a container (docker/postfix/)
#
# OPTIONS (first start; a later start reuses what DIR/params recorded unless given again):
#   --filter HOST:PORT      aqgate's SMTP address: deployment B, aqgate as a before-queue
#                           content filter (smtpd_proxy_filter) on the public smtpd. Without
#                           it, deployment A: Postfix only delivers (and relays nothing).
#   --gateway-domain D      the domain of aqgate's gateway address (default aq.example.com)
#   --gateway-address A     a gateway address Postfix relays to aqgate (repeatable; default aq@D)
#   --domain D              the domain delivered into Maildirs (default example.com)
#   --mailbox LOCALPART     a mailbox of that domain (repeatable; default scott john bob postmaster)
#   --listen ADDR           where the smtpds listen (default 127.0.0.1; 0.0.0.0: every address)
#   --mynetworks NETS       the clients trusted on the reinjection port (default 127.0.0.0/8)
#   --log-file FILE         Postfix's log (default DIR/postfix.log; /dev/stdout with run in a container)
#   --smtp-port N --reinject-port N   fixed ports (both) instead of free ones
#
# The configuration is rendered from deploy/postfix/{main.cf,master.cf} (sed over their
# @NAME@ placeholders) into DIR/etc, with the maps DIR/etc/{vmailbox,relay_recipients,transport}.
# The instance runs as `postfix -c DIR/etc start` (as root: Postfix accepts a private
# configuration directory then, no alternate_config_directories entry needed), with its own
# queue_directory (DIR/queue), data_directory (DIR/data) and log (DIR/postfix.log), listening
# on 127.0.0.1 only, on free ports. Mail for the domain is delivered by virtual(8) into
# Maildirs DIR/maildir/<localpart>/ (owned by nobody:nogroup). (--listen, --mynetworks,
# --log-file and fixed ports are for the container image; the tests use the defaults.)
# Files in DIR: smtp_port (the public smtpd), reinject_port (the after-filter smtpd, for
# aqgate's reinjection and replies), maildir/ (the Maildir base), params, postfix.log.
# Installs postfix (apt-get, non-interactive, "No configuration": the system instance is
# neither configured nor started, so nothing binds port 25); never touches /etc/postfix.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
templates="$repo/deploy/postfix"
POSTFIX=/usr/sbin/postfix

die() { echo "postfix.sh: $*" >&2; exit 1; }

ensure_installed() {
    [ -x "$POSTFIX" ] && [ -x /usr/lib/postfix/sbin/virtual ] && return
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    # Concurrent first uses (parallel tests) install once.
    exec 9>"${TMPDIR:-/tmp}/aqgate-postfix-install.lock"
    flock 9
    if [ ! -x "$POSTFIX" ]; then
        echo "postfix.sh: installing postfix" >&2
        export DEBIAN_FRONTEND=noninteractive
        # No main.cf for the system instance: it does not start (Debian's init script and
        # systemd unit need /etc/postfix/main.cf), so nothing listens on port 25.
        printf 'postfix postfix/main_mailer_type select No configuration\n' | $sudo debconf-set-selections
        $sudo apt-get update -qq >&2 || true
        $sudo apt-get install -y -qq postfix >&2
    fi
    flock -u 9
    [ -x "$POSTFIX" ] || die "postfix is not installed"
}

port_in_use() { (exec 3<>"/dev/tcp/${2:-127.0.0.1}/$1") 2>/dev/null; }

free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$(( 20000 + RANDOM % 40000 ))
        if ! port_in_use "$p"; then echo "$p"; return; fi
    done
    die "no free port found"
}

master_pid() {
    local f="$1/queue/pid/master.pid" pid
    [ -f "$f" ] || return 1
    pid="$(tr -d ' \n' < "$f")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    # The pid file may be stale and the number reused: it must be our instance's master.
    grep -qsxzF "MAIL_CONFIG=$1/etc" "/proc/$pid/environ" || return 1
    echo "$pid"
}

running() { master_pid "$1" >/dev/null; }

# Every process of this instance (master and its children carry MAIL_CONFIG=DIR/etc).
instance_pids() {
    local dir="$1" p
    for p in /proc/[0-9]*; do
        grep -qsxzF "MAIL_CONFIG=$dir/etc" "$p/environ" && echo "${p#/proc/}"
    done
    return 0
}

# The parameters, one NAME=VALUE a line (values without newlines).
param() { sed -n "s/^$1=//p" "$DIR/params" | tail -n 1; }

# Where clients on this machine reach the smtpds.
connect_host() {
    local l
    l="$(param listen)"
    case "$l" in "" | 0.0.0.0) echo 127.0.0.1 ;; *) echo "$l" ;; esac
}

render() {
    local dir="$1" uid gid f
    uid="$(id -u nobody)"; gid="$(getent group nogroup | cut -d: -f3)"
    mkdir -p "$dir/etc" "$dir/queue" "$dir/data" "$dir/maildir"
    chown postfix:postfix "$dir/data"
    chown "$uid:$gid" "$dir/maildir"
    local filter gwdomain domain listen inet mynetworks log
    filter="$(param filter)"; gwdomain="$(param gateway_domain)"; domain="$(param domain)"
    # (params written before these options existed do not have them: the defaults)
    listen="$(param listen)"; listen="${listen:-127.0.0.1}"
    mynetworks="$(param mynetworks)"; mynetworks="${mynetworks:-127.0.0.0/8}"
    log="$(param log_file)"; log="${log:-$dir/postfix.log}"
    # master.cf binds each smtpd to @LISTEN@; main.cf's inet_interfaces must name it too
    # (Postfix refuses inet_interfaces = 0.0.0.0: that is "all").
    inet="$listen"
    [ "$listen" != 0.0.0.0 ] || inet=all
    # Deployment A: no filter, and Postfix does not relay for the gateway domain at all.
    local relay="$gwdomain"
    [ -n "$filter" ] || relay=""
    for f in main.cf master.cf; do
        sed -e "s|@CONFIG_DIR@|$dir/etc|g" -e "s|@QUEUE_DIR@|$dir/queue|g" -e "s|@DATA_DIR@|$dir/data|g" \
            -e "s|@LOG_FILE@|$log|g" -e "s|@MYHOSTNAME@|mx.$domain|g" -e "s|@LISTEN@|$listen|g" \
            -e "s|@INET_INTERFACES@|$inet|g" \
            -e "s|@LOCAL_DOMAIN@|$domain|g" -e "s|@GATEWAY_DOMAIN@|$relay|g" -e "s|@MAILDIR_BASE@|$dir/maildir|g" \
            -e "s|@VMAIL_UID@|$uid|g" -e "s|@VMAIL_GID@|$gid|g" -e "s|@MYNETWORKS@|$mynetworks|g" \
            -e "s|@SMTP_PORT@|$(cat "$dir/smtp_port")|g" -e "s|@REINJECT_PORT@|$(cat "$dir/reinject_port")|g" \
            -e "s|@AQGATE_FILTER@|$filter|g" "$templates/$f" > "$dir/etc/$f"
        ! grep -n '@[A-Z_]*@' "$dir/etc/$f" | grep -v '^[0-9]*:#' || die "unrendered placeholder in $f"
    done
    : > "$dir/etc/vmailbox"
    sed -n 's/^mailbox=//p' "$dir/params" | while read -r m; do
        printf '%s@%s %s/\n' "$m" "$domain" "$m" >> "$dir/etc/vmailbox"
    done
    : > "$dir/etc/relay_recipients"
    : > "$dir/etc/transport"
    if [ -n "$filter" ]; then
        sed -n 's/^gateway_address=//p' "$dir/params" | while read -r a; do
            printf '%s OK\n' "$a" >> "$dir/etc/relay_recipients"
        done
        printf '%s smtp:[%s]:%s\n' "$gwdomain" "${filter%:*}" "${filter##*:}" > "$dir/etc/transport"
    fi
}

wait_ready() {
    local dir="$1" host
    host="$(connect_host)"
    for _ in $(seq 1 100); do
        if port_in_use "$(cat "$dir/smtp_port")" "$host" && port_in_use "$(cat "$dir/reinject_port")" "$host"; then
            return 0
        fi
        running "$dir" || return 1
        sleep 0.1
    done
    return 1
}

# Records OPTIONS in DIR/params (fixed ports in DIR/smtp_port, DIR/reinject_port); sets
# GIVEN to the number of options given.
configure() {
    local -a given=()
    local smtp_port="" reinject_port=""
    while [ $# -gt 0 ]; do
        [ $# -ge 2 ] || die "option $1 needs a value"
        case "$1" in
            --filter) given+=("filter=$2"); shift 2 ;;
            --gateway-domain) given+=("gateway_domain=$2"); shift 2 ;;
            --gateway-address) given+=("gateway_address=$2"); shift 2 ;;
            --domain) given+=("domain=$2"); shift 2 ;;
            --mailbox) given+=("mailbox=$2"); shift 2 ;;
            --listen) given+=("listen=$2"); shift 2 ;;
            --mynetworks) given+=("mynetworks=$2"); shift 2 ;;
            --log-file) given+=("log_file=$2"); shift 2 ;;
            --smtp-port) smtp_port="$2"; shift 2 ;;
            --reinject-port) reinject_port="$2"; shift 2 ;;
            *) die "unknown option $1" ;;
        esac
    done
    local g
    for g in "${given[@]}"; do
        case "$g" in *$'\n'* | *'|'*) die "option values must not contain newlines or |" ;; esac
    done
    for g in $smtp_port $reinject_port; do
        case "$g" in *[!0-9]*) die "bad port $g" ;; esac
    done
    if { [ -n "$smtp_port" ] && [ -z "$reinject_port" ]; } || { [ -z "$smtp_port" ] && [ -n "$reinject_port" ]; }; then
        die "--smtp-port and --reinject-port go together"
    fi
    GIVEN=${#given[@]}
    [ -z "$smtp_port" ] || { echo "$smtp_port" > "$DIR/smtp_port"; GIVEN=$((GIVEN + 1)); }
    [ -z "$reinject_port" ] || { echo "$reinject_port" > "$DIR/reinject_port"; GIVEN=$((GIVEN + 1)); }
    if [ ! -f "$DIR/params" ] || [ ${#given[@]} -gt 0 ]; then
        # Defaults, then what an earlier start recorded, then what is given now: for each
        # name the last source that has it wins (a repeatable one is replaced as a whole).
        local old="" k src
        [ -f "$DIR/params" ] && old="$(cat "$DIR/params")"
        local defaults="filter=
gateway_domain=aq.example.com
domain=example.com
mailbox=scott
mailbox=john
mailbox=bob
mailbox=postmaster
listen=127.0.0.1
mynetworks=127.0.0.0/8
log_file="
        : > "$DIR/params.new"
        for k in filter gateway_domain domain gateway_address mailbox listen mynetworks log_file; do
            for src in "${given[*]:+$(printf '%s\n' "${given[@]}")}" "$old" "$defaults"; do
                if printf '%s\n' "$src" | grep -q "^$k="; then
                    printf '%s\n' "$src" | grep "^$k=" >> "$DIR/params.new"
                    break
                fi
            done
        done
        if ! grep -q '^gateway_address=' "$DIR/params.new"; then
            echo "gateway_address=aq@$(sed -n 's/^gateway_domain=//p' "$DIR/params.new")" >> "$DIR/params.new"
        fi
        mv "$DIR/params.new" "$DIR/params"
    fi
}

start() {
    DIR="$1"; shift
    ensure_installed
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    configure "$@"
    if running "$DIR"; then
        [ "$GIVEN" -eq 0 ] || { render "$DIR"; $POSTFIX -c "$DIR/etc" reload >/dev/null 2>&1; }
        echo "$(connect_host):$(cat "$DIR/smtp_port")"
        return
    fi
    local attempt fresh=0
    [ -f "$DIR/smtp_port" ] || fresh=1
    for attempt in 1 2 3 4 5; do
        if [ "$fresh" = 1 ]; then
            free_port > "$DIR/smtp_port"; free_port > "$DIR/reinject_port"
            [ "$(cat "$DIR/smtp_port")" != "$(cat "$DIR/reinject_port")" ] || continue
        fi
        render "$DIR"
        # `postfix check` runs post-install over the installation's shared directories and
        # reports through syslog only (none here): instances started at once (the tests
        # start several) take turns, so that one's check cannot trip over another's.
        if ! flock "${TMPDIR:-/tmp}/aqgate-postfix-check.lock" \
                $POSTFIX -c "$DIR/etc" check >>"$DIR/postfix.check.log" 2>&1; then
            tail -n 20 "$DIR/postfix.log" "$DIR/postfix.check.log" >&2 2>/dev/null || true
            die "postfix check failed for $DIR/etc"
        fi
        # postfix start daemonises the master (in its own session), which outlives this script.
        $POSTFIX -c "$DIR/etc" start >>"$DIR/postfix.check.log" 2>&1 || true
        if wait_ready "$DIR"; then echo "$(connect_host):$(cat "$DIR/smtp_port")"; return; fi
        stop "$DIR" >/dev/null 2>&1 || true
        if [ "$fresh" = 0 ]; then
            # The old ports may be taken (or still closing): wait a little and retry them.
            sleep 1
            [ "$attempt" -lt 5 ] || break
        fi
    done
    tail -n 20 "$DIR/postfix.log" >&2 || true
    die "postfix did not start (see $DIR/postfix.log)"
}

run() {
    DIR="$1"; shift
    ensure_installed
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    configure "$@"
    # No "already running" check: in a restarted container the old pid file names PID 1
    # (postfix start-fg refuses to start a second master itself).
    [ -f "$DIR/smtp_port" ] || free_port > "$DIR/smtp_port"
    [ -f "$DIR/reinject_port" ] || free_port > "$DIR/reinject_port"
    render "$DIR"
    $POSTFIX -c "$DIR/etc" check || die "postfix check failed for $DIR/etc"
    echo "postfix.sh: smtpd on port $(cat "$DIR/smtp_port") (filter: $(param filter)), reinjection smtpd on port $(cat "$DIR/reinject_port")" >&2
    exec $POSTFIX -c "$DIR/etc" start-fg
}

stop() {
    local dir pids
    dir="$(cd "$1" 2>/dev/null && pwd)" || return 0
    [ -d "$dir/etc" ] || return 0
    if running "$dir"; then
        $POSTFIX -c "$dir/etc" stop >/dev/null 2>&1 || true
    fi
    # The master exits at once; its children when they notice. Wait for all, then kill.
    for _ in $(seq 1 100); do
        pids="$(instance_pids "$dir")"
        [ -n "$pids" ] || return 0
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
}

cmd="${1:-}"
case "$cmd" in
    install) ensure_installed; exit 0 ;;
esac
[ $# -ge 2 ] || { sed -n '2,35p' "$0" >&2; exit 2; }
shift
case "$cmd" in
    start) start "$@" ;;
    run) run "$@" ;;
    stop) stop "$1" ;;
    status) d="$(cd "$1" 2>/dev/null && pwd)" || exit 1; running "$d" ;;
    *) sed -n '2,35p' "$0" >&2; exit 2 ;;
esac
