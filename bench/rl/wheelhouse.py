"""The workload's dependencies: real wheels from PyPI, downloaded once on the host.

A task's setup installs its repository's dependencies with pip inside the sandbox, as a SWE
task's environment build does. Sandboxes here have no network, so the wheels are fetched on
the host (``pip download``, cached under ``build/rl-wheelhouse/``) and uploaded into each
sandbox that runs the setup, which is what a clone or a download would cost there. ``pip``
itself is one of the wheels: the venv is made ``--without-pip`` (the base image has no
``ensurepip``) and pip runs from its wheel, as pip's documentation allows.

The host's Python must match the sandbox's (both Debian 12's 3.11 here): pip picks wheels
for the interpreter that runs ``pip download``. A mismatch shows up as the setup's pip
failing with "No matching distribution", the setup's error, not a wrong number.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path

from aenv.core import proc

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "rl-wheelhouse"
#: What the workload's repository depends on by default: a data stack and its test runner
#: (34 MB of wheels, a 160 MB venv; ~17 s of pip in a sandbox on this machine).
DEPENDENCIES = ("numpy", "pandas", "pytest", "requests")
#: Where the setup finds the wheels in the sandbox (removed once installed).
SANDBOX_DIR = "/tmp/wheels"
_COMPLETE = ".complete"


def wheels(requirements: tuple[str, ...], cache: Path = CACHE) -> dict[str, bytes]:
    """File name → bytes of every wheel ``requirements`` (and pip) need, from the cache or
    downloaded into it. Empty for no requirements (then the setup installs nothing)."""
    if not requirements:
        return {}
    wanted = ("pip", *sorted(requirements))
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:16]
    folder = cache / key
    if not (folder / _COMPLETE).exists():
        folder.mkdir(parents=True, exist_ok=True)
        asyncio.run(proc.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
             "--dest", str(folder), *wanted],
            timeout=900.0))
        (folder / _COMPLETE).write_text("\n".join(wanted) + "\n")
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.whl"))}


def pip_wheel(names: list[str]) -> str:
    """The pip wheel's file name among ``names``."""
    return next(n for n in names if n.startswith("pip-") and n.endswith(".whl"))
