#!/usr/bin/env bash
# Validates compose.yaml and the Dockerfiles it builds without a Docker engine (CI has none;
# the images themselves are not built here):
#   1. `docker-compose -f compose.yaml config -q`: PyPI's docker-compose v1, installed on first
#      use into a private venv (AQGATE_COMPOSE_VENV, default ~/.cache/aqgate/compose-venv) from
#      the pinned list scripts/validate-compose.requirements.txt. The file must parse, match
#      the compose schema, and its build contexts must exist.
#   2. scripts/validate-compose.py over the resolved configuration: COPY/ADD sources exist in
#      their context and pass .dockerignore, what the containers run was copied in and is
#      executable, bind mounts exist, the files the binary embeds reach its build stage,
#      every Dockerfile is used.
#   3. bash -n (and shellcheck, hadolint, when installed) on the images' entrypoints and
#      Dockerfiles.
# Exits non-zero, saying why, on the first failing step. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

req=scripts/validate-compose.requirements.txt
venv="${AQGATE_COMPOSE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/aqgate/compose-venv}"
compose="$venv/bin/docker-compose"

fail() { echo "validate-compose: FAILED: $*" >&2; exit 1; }

# The venv is reinstalled whenever the requirements change (the stamp is their digest).
stamp="$(sha256sum "$req" | cut -d' ' -f1)"
if [ ! -x "$compose" ] || [ "$(cat "$venv/.stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "validate-compose: installing docker-compose 1.29.2 into $venv" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        # Debian's python3 makes venvs only with python3-venv (ensurepip).
        rm -rf "$venv"
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            echo "validate-compose: installing python3-venv" >&2
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq python3-venv >/dev/null
        fi
        python3 -m venv "$venv" || fail "cannot create a Python venv (install python3-venv)"
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req" ||
        fail "cannot install the packages of $req"
    echo "$stamp" > "$venv/.stamp"
fi

# 1. The compose file itself. Nothing from the caller's environment may change it.
unset COMPOSE_FILE COMPOSE_PROJECT_NAME COMPOSE_PROFILES DOCKER_HOST
"$compose" -f compose.yaml config -q || fail "docker-compose config rejects compose.yaml (see above)"
resolved="$(mktemp)"
trap 'rm -f "$resolved"' EXIT
"$compose" -f compose.yaml config > "$resolved" 2>/dev/null || fail "docker-compose config"

# 2. The files compose.yaml and the Dockerfiles reference.
"$venv/bin/python" scripts/validate-compose.py "$resolved" . || fail "compose.yaml / Dockerfiles (see above)"

# Every workspace crate's manifest is in the Dockerfile's dependency layer (cargo reads
# the whole workspace before it builds anything).
for m in crates/*/Cargo.toml; do
  grep -qF "COPY $m $(dirname "$m")/" Dockerfile || fail "Dockerfile: no COPY of $m in the dependency layer"
done

# 3. The entrypoints and Dockerfiles, with what is installed.
for f in docker/*/entrypoint.sh; do
    bash -n "$f" || fail "$f: syntax"
done
if command -v shellcheck >/dev/null 2>&1; then
    shellcheck docker/*/entrypoint.sh scripts/slapd.sh scripts/postfix.sh scripts/validate-compose.sh ||
        fail "shellcheck"
else
    echo "validate-compose: shellcheck not installed, skipped" >&2
fi
if command -v hadolint >/dev/null 2>&1; then
    # Findings are shown; only errors fail (apt-get without version pins is a warning: the
    # images follow Debian bookworm's updates on purpose).
    hadolint --failure-threshold error Dockerfile docker/*/Dockerfile || fail "hadolint"
else
    echo "validate-compose: hadolint not installed, skipped" >&2
fi
echo "validate-compose: ok (compose.yaml and $(find . -name Dockerfile -not -path './target/*' | wc -l) Dockerfiles; no image was built)"
