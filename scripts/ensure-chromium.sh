#!/usr/bin/env bash
# Installs the browser the browser tests drive (tests/browser.rs, tests/common/browser.rs):
# Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver), when
# either is missing. Both come from the same source package, so their versions match; the
# check below refuses a pair that does not (ChromeDriver drives only its own Chromium).
# Idempotent and quiet when both are present.
set -euo pipefail
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "ensure-chromium: installing chromium chromium-driver" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# "Chromium 156.0.8078.129 built on Debian ..." and "ChromeDriver 156.0.8078.129 (...)".
browser=$(/usr/bin/chromium --version 2>/dev/null | awk '{ print $2 }')
driver=$(/usr/bin/chromedriver --version 2>/dev/null | awk '{ print $2 }')
if [ -z "$browser" ] || [ "$browser" != "$driver" ]; then
  echo "ensure-chromium: chromium ${browser:-?} and chromedriver ${driver:-?} differ; install both from one release" >&2
  exit 1
fi
