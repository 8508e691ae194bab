#!/usr/bin/env bash
# The README's quick start on a fresh machine: a Debian bookworm chroot (debootstrap, minbase)
# with a C toolchain (gcc, make, perl), CA certificates and this machine's Rust toolchain, and
# nothing else: no libssl-dev, libxmlsec1-dev, libclang, pkg-config. The repository's files
# (committed or not, as git lists them) are copied in, built with `cargo build --release`, and
# started with the README's first command, `cargo run --release -- serve`, in the copy. The
# README's other quick-start blocks then run verbatim from the copy's root, on this machine
# (curl, swaks, openssl), with `cargo` answered by the chroot's; their answers are checked.
# Then: the binary links no OpenSSL, libxml2 or xmlsec1, and refuses the SAML settings,
# naming the `saml` feature.
#
# Needs root (debootstrap, chroot, mount) and the README's ports, 8470 and 2525, free.
# AQGATE_FRESH_ROOT: where the chroot is kept (made once, and made again when the package list
# below changes); AQGATE_DEBIAN_MIRROR: the Debian mirror (default: the machine's own).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
root=${AQGATE_FRESH_ROOT:-/var/tmp/aqgate-fresh-machine}
packages=gcc,libc6-dev,make,perl,ca-certificates
say() { echo "fresh-machine: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
# The machine's own Debian mirror: its deb822 debian.sources, else its one-line sources.
mirror=${AQGATE_DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | awk '{ print $1; exit }')}
mirror=${mirror:-$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)}
[ -n "$mirror" ] || fail "no Debian mirror in this machine's apt sources: set AQGATE_DEBIAN_MIRROR"

[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, chroot, mount)"
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=$(dirname "$(command -v cargo)")
[ -d "$rustup_home/toolchains" ] || fail "no rustup toolchain under $rustup_home"
for port in 8470 2525; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is taken: the quick start's commands use it"
  fi
done
command -v debootstrap >/dev/null 2>&1 || {
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
}
for tool in curl swaks openssl git; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found (scripts/ensure-tools.sh installs it)"
done

mounts=()
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then kill -TERM -- "-$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

if [ "$(cat "$root/.aqgate-packages" 2>/dev/null)" != "$packages" ]; then
  say "making the chroot in $root (debootstrap $packages from $mirror)"
  rm -rf "$root"
  mkdir -p "$root"
  debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log" >&2; fail "debootstrap"; }
  echo "$packages" >"$root/.aqgate-packages"
fi
for pkg in libssl-dev libxmlsec1-dev libxml2-dev libclang-dev pkg-config pkgconf; do
  if chroot "$root" dpkg -s "$pkg" >/dev/null 2>&1; then fail "the chroot has $pkg: it is not a fresh machine"; fi
done
for header in openssl/ssl.h xmlsec/xmlsec.h libxml/parser.h clang-c/Index.h; do
  [ ! -e "$root/usr/include/$header" ] || fail "the chroot has /usr/include/$header"
done

bind() { # bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
bind /proc "$root/proc"
bind /dev "$root/dev"
bind "$rustup_home" "$root/opt/rustup" ro
bind "$cargo_bin" "$root/opt/cargo-bin" ro
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The local certificate authorities this machine's network needs (a TLS-intercepting egress
# proxy, say) belong to the machine, not to the project: the chroot trusts them too.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 || fail "update-ca-certificates in the chroot"
fi

# The repository as a fresh clone with this checkout's changes: the files git lists.
# AQGATE_FRESH_REUSE_TARGET=1 keeps the previous copy's target/ (a quicker re-check of the
# steps after the build; test.sh does not set it, so CI builds from nothing).
copy=$root/src/aqgate
rm -rf "$root/src/target.kept"
if [ "${AQGATE_FRESH_REUSE_TARGET:-}" = 1 ] && [ -d "$copy/target" ]; then mv "$copy/target" "$root/src/target.kept"; fi
rm -rf "$copy"
mkdir -p "$copy"
if [ -d "$root/src/target.kept" ]; then mv "$root/src/target.kept" "$copy/target"; fi
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$copy"
# A fresh machine has its own cargo home (crates.io downloads) and no target directory.
in_chroot() { # in_chroot COMMAND...: run in the copy's root, inside the chroot
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/opt/cargo-bin:/usr/bin:/bin \
    RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo TERM=dumb \
    sh -c 'cd /src/aqgate && exec "$@"' sh "$@"
}
start=$(date +%s)
say "cargo build --release in the chroot"
in_chroot cargo build --release >"$root/build.log" 2>&1 || { tail -40 "$root/build.log" >&2; fail "the build"; }
say "built in $(($(date +%s) - start)) s"

# The binary stands alone: no OpenSSL, libxml2 or xmlsec1 from the system.
linked=$(in_chroot ldd target/release/aqgate)
if grep -E 'libssl|libcrypto|libxml|xmlsec' <<<"$linked"; then fail "the binary links a system library it must not"; fi

# The README's first command, as written.
serve_cmd=$(sed -n '/^## Quick start/,/^## /p' README.md | grep -m1 -o '^cargo run --release -- serve')
[ "$serve_cmd" = "cargo run --release -- serve" ] || fail "README's quick start no longer starts with cargo run --release -- serve"
setsid bash -c "$(declare -f in_chroot); root=$root; in_chroot $serve_cmd" >"$root/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 600); do
  curl -sf -o /dev/null http://127.0.0.1:8470/readyz && break
  kill -0 "$serve_pid" 2>/dev/null || { tail -20 "$root/serve.log" >&2; fail "serve exited"; }
  sleep 0.5
done
curl -sf -o /dev/null http://127.0.0.1:8470/readyz || { tail -20 "$root/serve.log" >&2; fail "serve did not get ready"; }
say "serve is ready"

# The README's other quick-start blocks, verbatim, from the copy's root; `cargo` is the chroot's.
shim=$(mktemp -d)
cat >"$shim/cargo" <<EOF
#!/usr/bin/env bash
exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/opt/cargo-bin:/usr/bin:/bin \\
  RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo TERM=dumb \\
  sh -c 'cd /src/aqgate && exec cargo "\$@"' sh "\$@"
EOF
# A reader waits for the reply mail before looking for it: swaks returns once the mail is
# accepted, and the reply is written to aqgate-outbox/ just after.
real_swaks=$(command -v swaks)
cat >"$shim/swaks" <<EOF
#!/usr/bin/env bash
before=\$(ls aqgate-outbox/*.eml 2>/dev/null | wc -l)
"$real_swaks" "\$@" || exit
for _ in \$(seq 1 120); do
  if [ "\$(ls aqgate-outbox/*.eml 2>/dev/null | wc -l)" -gt "\$before" ]; then sleep 1; exit 0; fi
  sleep 0.5
done
echo "fresh-machine: no reply in aqgate-outbox/ after 60 s" >&2
exit 1
EOF
chmod +x "$shim/cargo" "$shim/swaks"
blocks=$(sed -n '/^## Quick start/,/^## /p' README.md | awk '/^```sh$/ {n++; on = 1; next} /^```$/ {on = 0; next} on && n > 1')
[ -n "$blocks" ] || fail "README's quick start has no example blocks"
rm -f /tmp/aq.cookies
out=$(cd "$copy" && PATH="$shim:$PATH" bash -euo pipefail -c "$blocks" 2>&1) || { echo "$out" >&2; fail "a README block"; }
rm -rf "$shim"
for want in AQXmlSendResponse AQXmlCommitResponse AQXmlReceiveResponse AQXmlPublishResponse; do
  grep -q "$want" <<<"$out" || { echo "$out" >&2; fail "no $want in the quick start's answers"; }
done
if grep -q 'Fault' <<<"$out"; then echo "$out" >&2; fail "a Fault in the quick start's answers"; fi
[ "$(grep -o '<message_payload[ >]' <<<"$out" | wc -l)" -ge 2 ] ||
  { echo "$out" >&2; fail "the quick start received fewer than two messages"; }
say "the quick start's curl and swaks examples answered as the README says"

# SAML settings: refused at start, naming the feature.
if saml=$(in_chroot target/release/aqgate serve --listen 127.0.0.1:0 --no-smtp --database sqlite:///tmp/saml-check.db \
  --saml-idp-metadata /nonexistent.xml --saml-entity-id https://aq.example.com/sp 2>&1); then
  fail "serve started with SAML settings in a build without SAML"
fi
grep -q 'built with the `saml` feature' <<<"$saml" || { echo "$saml" >&2; fail "the SAML refusal does not name the feature"; }
say "ok: built in a chroot without libssl-dev, libxmlsec1-dev, libclang or pkg-config; quick start verified"
