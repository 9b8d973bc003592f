#!/usr/bin/env bash
# A Python >= 3.12 venv with Harbor and this checkout of aenv, for the Harbor integration test.
#
# Harbor (every release) requires Python >= 3.12; aenv's own venv is 3.11. So Harbor's runner
# (`harbor run -e aenv.integrations.harbor:AenvEnvironment`) runs from a venv of its own:
#   harbor[e2b]==$HARBOR_VERSION  (e2b 2.63.0 comes with it: the same pin as aenv's dev extra)
#   aenv, editable, --no-deps     (the plugin imports aenv.client only: httpx, e2b, packaging)
#
# Usage: scripts/harbor-venv.sh [VENV_DIR]      (default: $AENV_TEST_CACHE/harbor-venv)
# Prints the venv's directory on its last line. Idempotent: a stamp file names what the venv
# was made from (this script, the Harbor pin, the checkout); a venv whose stamp matches is
# reused as it is, any other is made afresh.
set -euo pipefail

HARBOR_VERSION=0.26.0
REPO=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
# One venv per checkout: it holds this checkout of aenv (editable), and two checkouts on one
# machine (a CI clone next to a working tree) must not rebuild each other's.
VENV=${1:-${AENV_TEST_CACHE:-/var/cache/aenv-test}/harbor-venv-$(printf %s "$REPO" | sha256sum | cut -c1-8)}
STAMP="$VENV/.aenv-harbor-stamp"

# Python >= 3.12: python3.12/python3.13 on PATH (pyenv shims that have no such version
# selected fail to run, so each candidate is tried), then pyenv's installed versions.
find_python() {
    local candidate
    for candidate in python3.13 python3.12 \
            "${PYENV_ROOT:-/root/.pyenv}"/versions/3.1[2-9]*/bin/python3 \
            /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
        if command -v "$candidate" >/dev/null 2>&1 \
                && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' \
                    >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if ! PYTHON=$(find_python); then
    echo "harbor-venv: no Python >= 3.12 found (tried python3.13, python3.12 on PATH and" \
         "${PYENV_ROOT:-/root/.pyenv}/versions/3.12+); Harbor requires Python >= 3.12." \
         "Install one (e.g. pyenv install 3.12) and run this again." >&2
    exit 1
fi

want="script=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16) harbor=$HARBOR_VERSION repo=$REPO"
want="$want python=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/harbor" ]; then
    echo "$VENV"
    exit 0
fi

echo "harbor-venv: making $VENV with $PYTHON (harbor[e2b]==$HARBOR_VERSION)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname -- "$VENV")"
"$PYTHON" -m venv "$VENV"
# A download that arrives damaged fails pip's hash check (a CI run met one); the next
# attempt downloads afresh (no cache) instead of failing the suite on one bad transfer.
for attempt in 1 2 3; do
    if "$VENV/bin/pip" install --quiet $([ "$attempt" -gt 1 ] && echo --no-cache-dir) \
            "harbor[e2b]==$HARBOR_VERSION" >&2; then
        break
    fi
    [ "$attempt" -lt 3 ] || exit 1
    echo "harbor-venv: pip install failed (attempt $attempt); trying again" >&2
    sleep 2
done
# aenv.client's runtime dependencies (harbor[e2b] brings them already; pinned here so a later
# Harbor that drops them cannot break the plugin), then the checkout itself without its
# server-side dependencies.
"$VENV/bin/pip" install --quiet "e2b==2.63.0" "httpx>=0.27" packaging >&2
"$VENV/bin/pip" install --quiet --no-deps -e "$REPO" >&2
"$VENV/bin/python" -c 'import harbor, aenv.client, aenv.integrations.harbor' >&2
echo "$want" > "$STAMP"
echo "$VENV"
