#!/usr/bin/env bash
# A throwaway SAML 2.0 identity provider: Debian's SimpleSAMLphp under PHP's built-in web
# server, with the exampleauth:UserPass login form. TEST ONLY (keys, passwords).
#
#   scripts/simplesamlphp.sh start DIR            start (or restart) the IdP kept in DIR; prints its base URL
#   scripts/simplesamlphp.sh stop DIR             stop it (SIGTERM, then SIGKILL after 10 s); keeps DIR
#   scripts/simplesamlphp.sh status DIR           exit 0 if it runs
#   scripts/simplesamlphp.sh login DIR SP USER PASSWORD
#                                                 log USER in through the IdP's login form (IdP-initiated
#                                                 SSO for the SP entityID SP, with curl) and print the
#                                                 SAMLResponse the IdP posts to the SP: base64 of the signed
#                                                 samlp:Response with its signed saml:Assertion
#   scripts/simplesamlphp.sh install              only install simplesamlphp + php-cli if missing
#
# The first start in an empty DIR makes a TEST ONLY signing key and certificate
# (DIR/cert/idp.key, idp.pem), the configuration (DIR/config: Debian's config.php with this
# IdP's settings appended, authsources.php, DIR/metadata) and picks a free port on
# 127.0.0.1 (another one if it is taken when the server starts: the URL printed is the
# one). Files in DIR: url, idp-metadata.xml (the IdP's metadata as it serves it), php.pid,
# php.log.
#
# Users (exampleauth:UserPass, attribute uid = the user name, mail = USER@example.com):
#   scott/tiger, john/welcome, nobody/nobody, mailonly/mailonly, scott@evil.example/evil,
#   and look-alikes of scott (password tiger) whose uid is not exactly scott: scott-nbsp
#   (U+00A0 after it), scott-ideographic (U+3000 after it), scott-padded (" scott "),
#   scott-cyrillic (a Cyrillic o)
# SPs the IdP knows (NameID = uid, format unspecified; assertion and Response signed):
#   urn:aqgate:test             what the tests configure as aqgate's entityID
#   urn:aqgate:assertion-signed only the assertion signed (audience urn:aqgate:test)
#   urn:aqgate:response-signed  only the Response signed (audience urn:aqgate:test)
#   urn:other:sp                another SP: its assertions name another audience
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SSP=/usr/share/simplesamlphp

die() { echo "simplesamlphp.sh: $*" >&2; exit 1; }

ensure_installed() {
    if [ -d "$SSP/www" ] && command -v curl >/dev/null && php -r "exit(class_exists(\"DOMDocument\") ? 0 : 1);" 2>/dev/null; then return; fi
    echo "simplesamlphp.sh: installing simplesamlphp, php-cli, php-xml, php-mbstring and curl" >&2
    export DEBIAN_FRONTEND=noninteractive
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    # Tests start servers in parallel: one apt-get at a time.
    exec 9>/tmp/aqgate-apt.lock
    flock 9
    if [ -d "$SSP/www" ] && command -v curl >/dev/null && php -r "exit(class_exists(\"DOMDocument\") ? 0 : 1);" 2>/dev/null; then exec 9>&-; return; fi
    $sudo apt-get update -qq >&2 || true
    $sudo apt-get install -y -qq simplesamlphp php-cli php-xml php-mbstring curl >&2
    exec 9>&-
    [ -d "$SSP/www" ] || die "simplesamlphp is not installed"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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
    [ -f "$dir/php.pid" ] || return 1
    pid="$(cat "$dir/php.pid")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

sp_entry() { # entityID, extra PHP options
    cat <<EOF
\$metadata['$1'] = [
    'AssertionConsumerService' => 'http://127.0.0.1:9/acs',
    'NameIDFormat' => 'urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified',
    'simplesaml.nameidattribute' => 'uid',
    $2
];
EOF
}

init() {
    local dir="$1" port
    [ -f "$dir/url" ] && return
    mkdir -p "$dir/cert" "$dir/config" "$dir/metadata" "$dir/sessions" "$dir/tmp" "$dir/log" "$dir/data"
    port="$(free_port)"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=aqgate test IdP (TEST ONLY)" \
        -keyout "$dir/cert/idp.key" -out "$dir/cert/idp.pem" 2>/dev/null
    cp "$SSP/config/config.php" "$dir/config/config.php"
    cat >> "$dir/config/config.php" <<EOF

// aqgate's test IdP (scripts/simplesamlphp.sh): TEST ONLY.
\$config['baseurlpath'] = 'http://127.0.0.1:$port/';
\$config['certdir'] = '$dir/cert/';
\$config['loggingdir'] = '$dir/log/';
\$config['datadir'] = '$dir/data/';
\$config['tempdir'] = '$dir/tmp';
\$config['metadatadir'] = '$dir/metadata/';
\$config['metadata.sources'] = [['type' => 'flatfile', 'directory' => '$dir/metadata/']];
\$config['secretsalt'] = 'test-only-not-a-secret-$(openssl rand -hex 8)';
\$config['auth.adminpassword'] = 'test-only-not-a-secret';
\$config['technicalcontact_email'] = 'test@example.com';
\$config['timezone'] = 'UTC';
\$config['logging.handler'] = 'errorlog';
\$config['logging.level'] = SimpleSAML\Logger::WARNING;
\$config['enable.saml20-idp'] = true;
\$config['module.enable'] = ['exampleauth' => true, 'core' => true, 'saml' => true, 'admin' => true];
\$config['store.type'] = 'phpsession';
\$config['session.phpsession.savepath'] = '$dir/sessions';
\$config['session.cookie.secure'] = false;
EOF
    cat > "$dir/config/authsources.php" <<'EOF'
<?php
$config = [
    'admin' => ['core:AdminPassword'],
    'example-userpass' => [
        'exampleauth:UserPass',
        'scott:tiger' => ['uid' => ['scott'], 'mail' => ['scott@example.com']],
        'john:welcome' => ['uid' => ['john'], 'mail' => ['john@example.com']],
        'nobody:nobody' => ['uid' => ['nobody'], 'mail' => ['nobody@example.com']],
        'mailonly:mailonly' => ['uid' => ['mailonly'], 'mail' => ['mailonly@example.com']],
        'scott@evil.example:evil' => ['uid' => ['scott@evil.example'], 'mail' => ['scott@evil.example']],
        // Look-alikes of scott: a name that is not exactly an agent's must not become it.
        'scott-nbsp:tiger' => ['uid' => ["scott\u{00a0}"], 'mail' => ['scott-nbsp@example.com']],
        'scott-ideographic:tiger' => ['uid' => ["scott\u{3000}"], 'mail' => ['scott-ideographic@example.com']],
        'scott-padded:tiger' => ['uid' => [' scott '], 'mail' => ['scott-padded@example.com']],
        'scott-cyrillic:tiger' => ['uid' => ["sc\u{043e}tt"], 'mail' => ['scott-cyrillic@example.com']],
    ],
];
EOF
    cat > "$dir/metadata/saml20-idp-hosted.php" <<EOF
<?php
\$metadata['__DYNAMIC:1__'] = [
    'host' => '__DEFAULT__',
    'privatekey' => 'idp.key',
    'certificate' => 'idp.pem',
    'auth' => 'example-userpass',
    'signature.algorithm' => 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
];
EOF
    {
        echo '<?php'
        sp_entry urn:aqgate:test "'saml20.sign.assertion' => true, 'saml20.sign.response' => true,"
        sp_entry urn:aqgate:assertion-signed \
            "'saml20.sign.assertion' => true, 'saml20.sign.response' => false, 'audience' => ['urn:aqgate:test'],"
        sp_entry urn:aqgate:response-signed \
            "'saml20.sign.assertion' => false, 'saml20.sign.response' => true, 'audience' => ['urn:aqgate:test'],"
        sp_entry urn:other:sp "'saml20.sign.assertion' => true,"
    } > "$dir/metadata/saml20-sp-remote.php"
    echo "http://127.0.0.1:$port" > "$dir/url"
}

start() {
    local dir="$1" url port attempt
    ensure_installed
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    init "$dir"
    # A port taken meanwhile (tests start servers in parallel) moves the IdP to another one.
    for attempt in 1 2 3 4 5; do
        url="$(cat "$dir/url")"
        port="${url##*:}"
        if ! running "$dir"; then
            : > "$dir/php.log"
            SIMPLESAMLPHP_CONFIG_DIR="$dir/config" setsid php -S "127.0.0.1:$port" -t "$SSP/www" \
                >>"$dir/php.log" 2>&1 </dev/null &
            echo $! > "$dir/php.pid"
        fi
        for _ in $(seq 1 100); do
            if curl -fsS -o "$dir/idp-metadata.xml.new" "$url/saml2/idp/metadata.php" 2>/dev/null \
                && grep -q "EntityDescriptor" "$dir/idp-metadata.xml.new"; then
                mv "$dir/idp-metadata.xml.new" "$dir/idp-metadata.xml"
                echo "$url"
                return
            fi
            running "$dir" || break
            sleep 0.1
        done
        if running "$dir" || ! grep -q "Address already in use" "$dir/php.log"; then break; fi
        port="$(free_port)"
        sed -i "s|^\\\$config\['baseurlpath'\] = .*|\\\$config['baseurlpath'] = 'http://127.0.0.1:$port/';|" "$dir/config/config.php"
        echo "http://127.0.0.1:$port" > "$dir/url"
    done
    tail -20 "$dir/php.log" >&2 || true
    die "the IdP did not answer at $url"
}

stop() {
    local dir="$1" pid
    running "$dir" || return 0
    pid="$(cat "$dir/php.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$dir/php.pid"; return 0; }
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/php.pid"
}

# The value of the hidden input NAME in the HTML on stdin.
hidden() {
    grep -o "name=\"$1\" value=\"[^\"]*\"" | head -1 | sed -e "s/^name=\"$1\" value=\"//" -e 's/"$//' \
        | sed -e 's/&amp;/\&/g' -e 's/&quot;/"/g' -e 's/&#039;/'"'"'/g'
}

login() {
    local dir="$1" sp="$2" user="$3" password="$4" url jar page state response
    url="$(cat "$dir/url")"
    jar="$(mktemp)"
    trap 'rm -f "$jar"' RETURN
    # IdP-initiated SSO: the IdP redirects to its login form, which carries AuthState.
    page="$(curl -fsS -L -c "$jar" -b "$jar" --get --data-urlencode "spentityid=$sp" \
        "$url/saml2/idp/SSOService.php")" || die "SSOService failed"
    state="$(printf '%s' "$page" | hidden AuthState)"
    [ -n "$state" ] || die "no login form (AuthState) from the IdP"
    page="$(curl -fsS -L -c "$jar" -b "$jar" --data-urlencode "username=$user" \
        --data-urlencode "password=$password" --data-urlencode "AuthState=$state" \
        "$url/module.php/core/loginuserpass.php")" || die "the login form failed"
    response="$(printf '%s' "$page" | hidden SAMLResponse)"
    [ -n "$response" ] || die "the IdP answered no SAMLResponse (wrong password?)"
    printf '%s\n' "$response"
}

cmd="${1:-}"
case "$cmd" in
    start) [ $# -eq 2 ] || die "usage: $0 start DIR"; start "$2" ;;
    stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    status) [ $# -eq 2 ] || die "usage: $0 status DIR"; running "$2" ;;
    login) [ $# -eq 5 ] || die "usage: $0 login DIR SP USER PASSWORD"; login "$2" "$3" "$4" "$5" ;;
    install) ensure_installed ;;
    *) die "usage: $0 start|stop|status|login|install ..." ;;
esac
