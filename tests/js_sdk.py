"""The official JS SDKs the tests run (``tests/js``: package.json pins ``e2b`` and
``@e2b/code-interpreter``) and their one install, shared by every JS test."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parent / "js"
NPM_TIMEOUT_S = 300


def _pins() -> dict[str, str]:
    """The exact versions package.json asks for (``e2b``, ``@e2b/code-interpreter``)."""
    manifest = json.loads((JS_DIR / "package.json").read_text())
    return {name: str(version) for name, version in manifest["dependencies"].items()}


def _installed() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in _pins():
        manifest = JS_DIR / "node_modules" / name / "package.json"
        found[name] = (str(json.loads(manifest.read_text())["version"])
                       if manifest.exists() else None)
    return found


def ensure_node_modules() -> None:
    """``npm ci`` (or ``npm install`` without a lock) unless the pinned SDK is already there.

    node_modules is gitignored, so a fresh checkout installs once; a stale install (the pin in
    package.json moved) is reinstalled rather than silently testing the old SDK.
    """
    if _installed() == _pins():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("node is installed but npm is not; cannot install tests/js dependencies")
    verb = "ci" if (JS_DIR / "package-lock.json").exists() else "install"
    result = subprocess.run(
        # --prefer-offline: the lock pins exact versions, so a warm npm cache needs no
        # registry round trips (here: 3 s instead of 80 s); a cold cache still downloads.
        [npm, verb, "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"npm {verb} failed in {JS_DIR}:\n{result.stdout}\n{result.stderr}")
    assert _installed() == _pins(), "npm did not install the pinned packages"
