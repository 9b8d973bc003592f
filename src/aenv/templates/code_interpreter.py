"""The built-in ``code-interpreter-v1`` template: what it is made of. Pure (no I/O but reading
this checkout's interpreter package).

E2B's ``e2b-code-interpreter`` SDKs create sandboxes of ``code-interpreter-v1`` and talk to
port 49999 inside them. aenv builds that template with its own template pipeline (the same
steps the E2B SDK's ``Template`` builder sends), on top of the ``base`` template:

1. the scientific Python stack and Jupyter's kernel machinery, pinned, from PyPI
   (``PIP_PACKAGES``), into the system Python, so a cell's ``pip install`` lands where the
   kernel looks;
2. Deno's binary from npm (its version pinned, checked against the registry's integrity
   hash), whose built-in Jupyter kernel runs JavaScript and TypeScript; ``bash_kernel`` runs
   bash;
3. the interpreter server (``aenv.interpreter``, this checkout's copy), started as the
   template's start command and checked ready by its ``/health``.

``Recipe.tag`` names everything above: a node builds the template again only when it changed.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = "code-interpreter-v1"
PORT = 49999
#: E2B's code-interpreter sandboxes have 2 vCPUs; the kernels with pandas and matplotlib
#: loaded take ~200 MiB.
CPU_COUNT = 2
MEMORY_MB = 1024

#: Pinned; the same pins as ``scripts/interpreter-venv.sh`` (the tests' host-side venv; a
#: unit test compares them). IPython comes with ipykernel.
PIP_PACKAGES: tuple[str, ...] = (
    "ipykernel==7.4.0",
    "jupyter_client==8.10.0",
    "bash_kernel==0.10.0",
    "numpy==2.4.6",
    "pandas==3.1.1",
    "matplotlib==3.11.2",
    "starlette==1.10.0",
    "uvicorn==0.55.0",
)
DENO_VERSION = "2.9.6"
DENO_TARBALL = (f"https://registry.npmjs.org/@deno/linux-x64-glibc/-/"
                f"linux-x64-glibc-{DENO_VERSION}.tgz")
#: The npm registry's ``dist.integrity`` of ``DENO_TARBALL`` (sha512, base64).
DENO_INTEGRITY = ("sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3i"
                  "LP9vBQJtEgc116OAoQ==")

#: Where the server's package lands in the sandbox (``PYTHONPATH`` of the start command).
SERVER_ROOT = "/opt/aenv-interpreter"
KERNELS = "/usr/local/share/jupyter/kernels"

_PIP = ("pip install --no-cache-dir --break-system-packages --disable-pip-version-check "
        + " ".join(PIP_PACKAGES)
        + " && python3 -m bash_kernel.install --prefix /usr/local")

_DENO = f"""set -e
tmp=$(mktemp -d)
curl -fsSL --retry 3 -o "$tmp/deno.tgz" {DENO_TARBALL}
want={DENO_INTEGRITY.removeprefix("sha512-")}
got=$(openssl dgst -sha512 -binary "$tmp/deno.tgz" | base64 -w0)
[ "$got" = "$want" ] || {{ echo "deno tarball: integrity $got, want $want" >&2; exit 1; }}
tar -xzf "$tmp/deno.tgz" -C "$tmp"
install -m 0755 "$tmp/package/deno" /usr/local/bin/deno
rm -rf "$tmp"
mkdir -p {KERNELS}/deno
cat > {KERNELS}/deno/kernel.json <<'EOF'
{{"argv": ["/usr/local/bin/deno", "jupyter", "--kernel", "--conn", "{{connection_file}}"],
 "display_name": "Deno", "language": "typescript"}}
EOF"""

START_CMD = (f"PYTHONPATH={SERVER_ROOT} python3 -m aenv.interpreter --host 0.0.0.0 "
             f"--port {PORT}")
READY_CMD = f"curl -fsS http://127.0.0.1:{PORT}/health"


@dataclass(frozen=True)
class Recipe:
    """What a build of the template is asked with (``BuildSource``'s E2B fields)."""

    steps: list[dict[str, Any]]
    start_cmd: str
    ready_cmd: str
    #: The uploaded context of the COPY step (a tar of the server's package) and its hash.
    context: bytes
    context_hash: str
    #: Names the whole recipe: a build tagged with it is this recipe's.
    tag: str


def server_package() -> Path:
    """This checkout's ``aenv/interpreter`` directory (what the sandbox runs)."""
    return Path(__file__).resolve().parents[1] / "interpreter"


def context_tar(package: Path) -> bytes:
    """``aenv/__init__.py`` and ``aenv/interpreter/**`` as a reproducible tar (sorted names,
    zero times and owners): the same checkout always gives the same bytes, hence hash."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))

        add("aenv/__init__.py", b"")
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                add(f"aenv/interpreter/{path.relative_to(package).as_posix()}",
                    path.read_bytes())
    return buffer.getvalue()


def recipe(package: Path | None = None) -> Recipe:
    context = context_tar(package or server_package())
    context_hash = hashlib.sha256(context).hexdigest()
    steps: list[dict[str, Any]] = [
        {"type": "USER", "args": ["root"]},
        {"type": "RUN", "args": [_PIP]},
        {"type": "RUN", "args": [_DENO]},
        {"type": "COPY", "args": ["aenv", f"{SERVER_ROOT}/aenv", "root", ""],
         "filesHash": context_hash},
        {"type": "USER", "args": ["user"]},
        {"type": "WORKDIR", "args": ["/home/user"]},
    ]
    named = repr((steps, START_CMD, READY_CMD, CPU_COUNT, MEMORY_MB)).encode()
    tag = "r-" + hashlib.sha256(named).hexdigest()[:12]
    return Recipe(steps, START_CMD, READY_CMD, context, context_hash, tag)
