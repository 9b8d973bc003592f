"""The built-in ``code-interpreter-v1`` template: what it is made of. Pure (no network; file
I/O only to write its build contexts).

E2B's ``e2b-code-interpreter`` SDKs create sandboxes of ``code-interpreter-v1`` and talk to
port 49999 inside them. aenv builds that template with its own template pipeline (the same
steps the E2B SDK's ``Template`` builder sends), on top of the ``base`` template:

1. the scientific Python stack and Jupyter's kernel machinery, every package pinned
   (``PIP_LOCK``), installed into the system Python (so a cell's ``pip install`` lands where
   the kernel looks) from wheels the *node* downloaded: the build needs no network inside the
   sandbox, and the node's own pip configuration (index, mirror, proxy, CA) applies;
2. Deno's binary from npm (its version pinned, its tarball checked by the node against the
   registry's integrity hash), whose Jupyter kernel runs JavaScript and TypeScript;
   ``bash_kernel`` runs bash;
3. R with IRkernel, from Debian's own packages (``R_PACKAGES`` and what they need that the
   ``base`` template lacks): the node resolves and downloads the ``.deb`` files against the
   base's package database and sources, apt checking each against the archive's signed
   indexes; the build only runs ``dpkg``;
4. the interpreter server (``aenv.interpreter``, this checkout's copy), started as the
   template's start command and checked ready by its ``/health``.

Three uploaded contexts, lowest first (``r``: the debs; ``inputs``: the wheels and the Deno
tarball; ``package``: the server), so a change of the server alone rebuilds only its layer and
one of the wheels leaves R's layer as it was. ``Recipe.tag`` names everything (the debs by
the hash of their bytes, so their exact versions): a node builds the template again only when
it changed.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

NAME = "code-interpreter-v1"
PORT = 49999
#: E2B's code-interpreter sandboxes have 2 vCPUs; the kernels with pandas and matplotlib
#: loaded take ~200 MiB.
CPU_COUNT = 2
MEMORY_MB = 1024

#: What the template offers; the same pins as ``scripts/interpreter-venv.sh`` (the tests'
#: host-side venv; a unit test compares them).
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
#: Every package installed (``PIP_PACKAGES`` and what they need), exact: the template is the
#: same wherever and whenever it is built.
PIP_LOCK: tuple[str, ...] = (
    "anyio==4.16.0", "asttokens==3.0.2", "bash-kernel==0.10.0", "click==8.5.1",
    "comm==0.2.3", "contourpy==1.3.3", "cycler==0.12.1", "debugpy==1.8.22",
    "executing==2.3.0", "filetype==1.2.0", "fonttools==4.68.0", "h11==0.16.0", "idna==3.20",
    "ipykernel==7.4.0", "ipython==9.18.1", "ipython-pygments-lexers==1.1.1", "jedi==0.20.1",
    "jupyter-client==8.10.0", "jupyter-core==5.9.1", "kiwisolver==1.5.1",
    "matplotlib==3.11.2", "matplotlib-inline==0.2.2", "nest-asyncio2==1.7.4",
    "numpy==2.4.6", "packaging==26.4", "pandas==3.1.1", "parso==0.8.7", "pexpect==4.9.0",
    "pillow==13.0.0", "platformdirs==4.14.9", "prompt-toolkit==3.0.53", "psutil==7.2.2",
    "ptyprocess==0.7.0", "pure-eval==0.2.4", "pygments==2.21.0", "pyparsing==3.3.3",
    "python-dateutil==4.0.0", "pyzmq==27.3.0", "stack-data==0.6.3", "starlette==1.10.0",
    "tornado==6.6.1", "traitlets==5.16.1", "typing-extensions==4.16.0", "tzdata==2026.6",
    "uvicorn==0.55.0", "wcwidth==0.9.4",
)
#: What ``pip download`` is told the sandbox is: bookworm's python3 on x86_64.
PYTHON_VERSION = "3.11"
WHEEL_PLATFORMS: tuple[str, ...] = (
    "manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64",
)

DENO_VERSION = "2.9.6"
DENO_TARBALL = (f"https://registry.npmjs.org/@deno/linux-x64-glibc/-/"
                f"linux-x64-glibc-{DENO_VERSION}.tgz")
#: The npm registry's ``dist.integrity`` of ``DENO_TARBALL`` (sha512, base64).
DENO_INTEGRITY = ("sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3i"
                  "LP9vBQJtEgc116OAoQ==")

#: R and its Jupyter kernel from the base's Debian suite (bookworm: R 4.2.2, IRkernel 1.3.2):
#: ``r-base-core``, not ``r-base``: neither the recommended packages (MASS, Matrix, lattice...)
#: nor the compilers ``r-base-dev`` brings; a template built from this one adds them.
R_PACKAGES: tuple[str, ...] = ("r-base-core", "r-cran-irkernel")

#: Where the server's package lands in the sandbox (``PYTHONPATH`` of the start command).
SERVER_ROOT = "/opt/aenv-interpreter"
KERNELS = "/usr/local/share/jupyter/kernels"
#: Where the inputs context lands for the install step (which removes it; not /tmp, which a
#: sandbox mounts afresh).
INPUTS = "/opt/aenv-interpreter-inputs"
#: Where the R context lands for its install step (which removes it).
R_INPUTS = "/opt/aenv-interpreter-r"

#: ``interrupt_mode: message``: an interrupt is a Jupyter message, on which Deno ends the
#: running script and keeps the kernel's state; the default SIGINT kills Deno's kernel.
_DENO_KERNEL = ('{"argv": ["/usr/local/bin/deno", "jupyter", "--kernel", "--conn", '
                '"{connection_file}"], "display_name": "Deno", "language": "typescript", '
                '"interrupt_mode": "message"}')

_INSTALL = "\n".join([
    "set -e",
    f"cd {INPUTS}",
    "pip install --no-index --no-cache-dir --break-system-packages "
    f"--disable-pip-version-check --find-links wheels {' '.join(PIP_PACKAGES)}",
    "python3 -m bash_kernel.install --prefix /usr/local",
    "tar -xzf deno.tgz package/deno",
    "install -m 0755 package/deno /usr/local/bin/deno",
    f"mkdir -p {KERNELS}/deno",
    f"printf '%s\\n' '{_DENO_KERNEL}' > {KERNELS}/deno/kernel.json",
    "cd /",
    f"rm -rf {INPUTS}",
])

# dpkg, not apt: the node already resolved the closure, and apt would want package lists the
# sandbox has none of. unsafe-io: the layer is committed only after the step, and a step that
# dies is thrown away. dpkg's ~1,000 lines go to the log only when it fails: streamed into
# the build log they cost seconds. The kernelspec comes with r-cran-irkernel
# (/usr/share/jupyter/kernels/ir); loading IRkernel checks its native libraries before the
# layer is kept.
_INSTALL_R = "\n".join([
    "set -e",
    f"cd {R_INPUTS}",
    "if ! DEBIAN_FRONTEND=noninteractive dpkg --install --force-unsafe-io debs/*.deb "
    "> dpkg.log 2>&1; then tail -n 50 dpkg.log; exit 1; fi",
    f"dpkg-query --show {' '.join(R_PACKAGES)}",
    "test -f /usr/share/jupyter/kernels/ir/kernel.json",
    "R --slave -e 'suppressPackageStartupMessages(library(IRkernel))'",
    "cd /",
    f"rm -rf {R_INPUTS} /var/log/dpkg.log /var/cache/debconf/*-old /var/lib/dpkg/*-old",
])

START_CMD = (f"PYTHONPATH={SERVER_ROOT} python3 -m aenv.interpreter --host 0.0.0.0 "
             f"--port {PORT}")
READY_CMD = f"curl -fsS http://127.0.0.1:{PORT}/health"


@dataclass(frozen=True)
class Recipe:
    """What a build of the template is asked with (``BuildSource``'s E2B fields)."""

    steps: list[dict[str, Any]]
    start_cmd: str
    ready_cmd: str
    #: Names the whole recipe: a build tagged with it is this recipe's.
    tag: str


def server_package() -> Path:
    """This checkout's ``aenv/interpreter`` directory (what the sandbox runs)."""
    return Path(__file__).resolve().parents[1] / "interpreter"


class _Tar:
    """A reproducible tar: entries in the order added, zero times and owners."""

    def __init__(self, out: BinaryIO) -> None:
        self._tar = tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def add(self, name: str, data: bytes | Path) -> None:
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = 0o644, 0
        if isinstance(data, Path):
            info.size = data.stat().st_size
            with data.open("rb") as fh:
                self._tar.addfile(info, fh)
        else:
            info.size = len(data)
            self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self._tar.close()


def package_tar(package: Path) -> bytes:
    """``aenv/__init__.py`` and ``aenv/interpreter/**`` (sorted, nothing compiled): the same
    checkout always gives the same bytes, hence hash."""
    buffer = io.BytesIO()
    tar = _Tar(buffer)
    tar.add("aenv/__init__.py", b"")
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            tar.add(f"aenv/interpreter/{path.relative_to(package).as_posix()}", path)
    tar.close()
    return buffer.getvalue()


def write_debs_tar(debs: Sequence[Path], out: BinaryIO) -> None:
    """``debs/*.deb`` (sorted by name) into ``out``. Blocking."""
    tar = _Tar(out)
    for deb in sorted(debs, key=lambda p: p.name):
        tar.add(f"debs/{deb.name}", deb)
    tar.close()


def write_inputs_tar(wheels: Sequence[Path], deno_tgz: Path, out: BinaryIO) -> None:
    """``wheels/*.whl`` (sorted by name) and ``deno.tgz`` into ``out``. Blocking."""
    tar = _Tar(out)
    for wheel in sorted(wheels, key=lambda p: p.name):
        tar.add(f"wheels/{wheel.name}", wheel)
    tar.add("deno.tgz", deno_tgz)
    tar.close()


def recipe(*, r_hash: str, inputs_hash: str, package_hash: str) -> Recipe:
    """The build's steps over the uploaded contexts ``r_hash``, ``inputs_hash`` and
    ``package_hash``."""
    steps: list[dict[str, Any]] = [
        {"type": "USER", "args": ["root"]},
        # R first: it changes least often (a new base, another R_PACKAGES), so new wheels or
        # a new server never reinstall it.
        {"type": "COPY", "args": [".", R_INPUTS, "root", ""], "filesHash": r_hash},
        {"type": "RUN", "args": [_INSTALL_R]},
        {"type": "COPY", "args": [".", INPUTS, "root", ""], "filesHash": inputs_hash},
        {"type": "RUN", "args": [_INSTALL]},
        {"type": "COPY", "args": ["aenv", f"{SERVER_ROOT}/aenv", "root", ""],
         "filesHash": package_hash},
        {"type": "USER", "args": ["user"]},
        {"type": "WORKDIR", "args": ["/home/user"]},
    ]
    named = repr((steps, START_CMD, READY_CMD, CPU_COUNT, MEMORY_MB)).encode()
    tag = "r-" + hashlib.sha256(named).hexdigest()[:12]
    return Recipe(steps, START_CMD, READY_CMD, tag)
