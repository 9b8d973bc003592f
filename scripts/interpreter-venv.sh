#!/usr/bin/env bash
# A venv that runs the code-interpreter server (aenv.interpreter) on the host, for its tests.
#
# Inside a `code-interpreter-v1` sandbox the server runs under the template's own python3 with
# its kernels installed beside it; on the host, tests/interpreter runs it from this venv:
#   the server:   starlette, uvicorn, jupyter_client        (all it imports)
#   the kernels:  ipykernel (python3), bash_kernel (bash), deno (javascript, typescript)
#   user code:    numpy, pandas, matplotlib                 (what the tests' cells import)
# aenv itself is not installed: the tests run `python -m aenv.interpreter` with PYTHONPATH=src,
# the way the template runs the package's files with nothing else of aenv beside them.
#
# Usage: scripts/interpreter-venv.sh [VENV_DIR]
#   (default: $AENV_TEST_CACHE/interpreter-venv-<hash of this script>)
# Prints the venv's directory on its last line. Idempotent: a stamp file names what the venv
# was made from (this script with its pins, the Python); a venv whose stamp matches is reused
# as it is, any other is made afresh. Deno comes from npm (`deno`'s platform package carries
# the binary); if it cannot be installed the venv is still made, without the deno kernel, and
# `<venv>/.deno-missing` says why (the JS/TS tests skip with that reason).
set -euo pipefail

IPYKERNEL_VERSION=7.4.0
JUPYTER_CLIENT_VERSION=8.10.0
BASH_KERNEL_VERSION=0.10.0
NUMPY_VERSION=2.4.6
PANDAS_VERSION=3.1.1
MATPLOTLIB_VERSION=3.11.2
STARLETTE_VERSION=1.10.0
UVICORN_VERSION=0.55.0
DENO_VERSION=2.9.6

SCRIPT_HASH=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-8)
# Keyed by the script (so by its pins), not by the checkout: nothing of the checkout is
# installed, so every checkout on the machine can share one venv.
VENV=${1:-${AENV_TEST_CACHE:-/var/cache/aenv-test}/interpreter-venv-$SCRIPT_HASH}
STAMP="$VENV/.aenv-interpreter-stamp"
# Debian's python3: the version a template's python3 is most likely to be (3.11 on bookworm).
PYTHON=${AENV_INTERPRETER_PYTHON:-/usr/bin/python3}

if ! "$PYTHON" -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    echo "interpreter-venv: $PYTHON is missing or older than 3.11 (or has no venv module)" >&2
    exit 1
fi

want="script=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
want="$want python=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    echo "$VENV"
    exit 0
fi

echo "interpreter-venv: making $VENV with $PYTHON" >&2
rm -rf "$VENV"
mkdir -p "$(dirname -- "$VENV")"
"$PYTHON" -m venv "$VENV"
# A download that arrives damaged fails pip's hash check; the next attempt downloads afresh.
for attempt in 1 2 3; do
    if "$VENV/bin/pip" install --quiet $([ "$attempt" -gt 1 ] && echo --no-cache-dir) \
            "ipykernel==$IPYKERNEL_VERSION" "jupyter_client==$JUPYTER_CLIENT_VERSION" \
            "bash_kernel==$BASH_KERNEL_VERSION" "numpy==$NUMPY_VERSION" \
            "pandas==$PANDAS_VERSION" "matplotlib==$MATPLOTLIB_VERSION" \
            "starlette==$STARLETTE_VERSION" "uvicorn==$UVICORN_VERSION" >&2; then
        break
    fi
    [ "$attempt" -lt 3 ] || exit 1
    echo "interpreter-venv: pip install failed (attempt $attempt); trying again" >&2
    sleep 2
done
# Kernelspecs go under the venv's share/jupyter, which jupyter_client searches when the
# server runs from this venv's python (sys.prefix), and nowhere outside the venv.
"$VENV/bin/python" -m bash_kernel.install --sys-prefix >&2

rm -f "$VENV/.deno-missing"
if npm install --silent --no-audit --no-fund --prefix "$VENV/deno" "deno@$DENO_VERSION" >&2 \
        && "$VENV/deno/node_modules/.bin/deno" --version >&2; then
    # The npm wrapper (`.bin/deno`) is a node script; the kernelspec must name the real binary
    # (deno writes its own path, current_exe, into kernel.json), so run that binary.
    DENO_BIN=$(find "$VENV/deno/node_modules/@deno" -maxdepth 2 -type f -name deno | head -1)
    if [ -n "$DENO_BIN" ]; then
        ln -sf "$DENO_BIN" "$VENV/bin/deno"
        # `deno jupyter --install` writes to the user's data dir (it ignores JUPYTER_DATA_DIR):
        # give it a scratch home, then move the kernelspec into the venv.
        scratch=$(mktemp -d)
        HOME="$scratch" XDG_DATA_HOME="$scratch/data" DENO_NO_UPDATE_CHECK=1 \
            DENO_DIR="$VENV/deno/cache" "$DENO_BIN" jupyter --install >&2
        spec=$(dirname -- "$(find "$scratch" -path '*/kernels/deno/kernel.json' | head -1)")
        mkdir -p "$VENV/share/jupyter/kernels"
        mv "$spec" "$VENV/share/jupyter/kernels/deno"
        # Interrupts as messages: Deno ends the running cell and keeps the kernel's state
        # (a SIGINT kills the kernel); the template's kernelspec says the same.
        "$VENV/bin/python" - "$VENV/share/jupyter/kernels/deno/kernel.json" <<'PY' >&2
import json, sys
spec = json.load(open(sys.argv[1]))
spec["interrupt_mode"] = "message"
json.dump(spec, open(sys.argv[1], "w"), indent=1)
PY
        rm -rf "$scratch"
    else
        echo "no deno binary in deno's npm platform packages" > "$VENV/.deno-missing"
    fi
else
    echo "npm could not install deno@$DENO_VERSION (its platform package)" > "$VENV/.deno-missing"
fi
if [ -f "$VENV/.deno-missing" ]; then
    echo "interpreter-venv: no deno kernel: $(cat "$VENV/.deno-missing")" >&2
fi

"$VENV/bin/python" -c 'import ipykernel, jupyter_client, bash_kernel, starlette, uvicorn' >&2
"$VENV/bin/jupyter" kernelspec list >&2
echo "$want" > "$STAMP"
echo "$VENV"
