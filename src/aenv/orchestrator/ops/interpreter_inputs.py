"""What the code-interpreter template is built from, fetched by the node: the locked wheels
(``pip download`` with the node's own pip configuration, so its index, mirror, proxy and CA
apply) and Deno's tarball (checked against the npm registry's integrity hash), kept under
``<home>/cache/code-interpreter`` so a rebuild downloads nothing; then the two build
contexts (``templates/code_interpreter.py``) stored as a build's uploads.

Why on the node and not in the build sandbox: the sandbox's network is not the node's (a
proxy that re-signs TLS, an index only the node is configured for) and a build that needs no
network inside is the same build everywhere.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.template_files import receive_files
from aenv.templates import code_interpreter as ci

#: A cold download is ~70 MB of wheels and ~45 MB of Deno.
DOWNLOAD_TIMEOUT_S = 900.0
CHUNK = 1 << 20


@dataclass(frozen=True)
class Contexts:
    inputs_hash: str
    package_hash: str


def cache_dir(node: Node) -> Path:
    return node.settings.home / "cache" / "code-interpreter"


async def wheels(cache: Path) -> list[Path]:
    """The locked wheels, downloaded into ``cache/wheels`` unless there already."""
    dest = cache / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    found = _locked(dest)
    if len(found) < len(ci.PIP_LOCK):
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--disable-pip-version-check", "--only-binary=:all:", "--dest", str(dest),
                "--python-version", ci.PYTHON_VERSION, "--implementation", "cp",
                "--abi", "cp" + ci.PYTHON_VERSION.replace(".", "")]
        for platform in ci.WHEEL_PLATFORMS:
            argv += ["--platform", platform]
        await proc.run([*argv, *ci.PIP_LOCK], timeout=DOWNLOAD_TIMEOUT_S)
        found = _locked(dest)
    missing = sorted(set(ci.PIP_LOCK) - set(found))
    if missing:
        raise FailedPrecondition(f"pip download did not bring {', '.join(missing)}")
    return sorted(found.values())


def _locked(directory: Path) -> dict[str, Path]:
    """``name==version`` of the lock → its wheel in ``directory`` (other files ignored)."""
    wanted = set(ci.PIP_LOCK)
    found: dict[str, Path] = {}
    for wheel in directory.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        pin = f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"
        if pin in wanted:
            found[pin] = wheel
    return found


async def deno(cache: Path) -> Path:
    """Deno's npm tarball, checked; downloaded into ``cache`` unless there (and whole)."""
    path = cache / f"deno-{ci.DENO_VERSION}.tgz"
    if path.is_file() and await asyncio.to_thread(_integrity, path) == ci.DENO_INTEGRITY:
        return path
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha512()
    # The system's trust store (as pip and curl use it), not certifi's: a node behind a
    # proxy that re-signs TLS trusts that proxy there.
    async with httpx.AsyncClient(verify=ssl.create_default_context(), timeout=60,
                                 follow_redirects=True) as client, \
            client.stream("GET", ci.DENO_TARBALL) as response:
        response.raise_for_status()
        with partial.open("wb") as fh:
            async for chunk in response.aiter_bytes(CHUNK):
                digest.update(chunk)
                await asyncio.to_thread(fh.write, chunk)
    got = "sha512-" + base64.b64encode(digest.digest()).decode()
    if got != ci.DENO_INTEGRITY:
        partial.unlink(missing_ok=True)
        raise FailedPrecondition(f"{ci.DENO_TARBALL}: integrity {got}, want {ci.DENO_INTEGRITY}")
    partial.replace(path)
    return path


def _integrity(path: Path) -> str:
    digest = hashlib.sha512()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


async def upload_contexts(node: Node) -> Contexts:
    """Fetch what is missing, then store both contexts as build uploads; their hashes."""
    cache = cache_dir(node)
    cache.mkdir(parents=True, exist_ok=True)
    package = await asyncio.to_thread(ci.package_tar, ci.server_package())
    package_hash = hashlib.sha256(package).hexdigest()
    await receive_files(node, package_hash, _bytes(package))
    # The inputs context is ~115 MB: made (and its Deno tarball re-checked) once per lock,
    # not at every start; the marker names the upload it made.
    lock_key = hashlib.sha256(repr((ci.PIP_LOCK, ci.DENO_INTEGRITY)).encode()).hexdigest()
    marker = cache / f"inputs-{lock_key[:16]}.sha256"
    known = marker.read_text().strip() if marker.is_file() else ""
    if known and (node.builder.files_dir / known).is_file():
        return Contexts(inputs_hash=known, package_hash=package_hash)
    locked, tgz = await asyncio.gather(wheels(cache), deno(cache))
    with tempfile.TemporaryFile(dir=cache) as out:
        inputs_hash = await asyncio.to_thread(_write_inputs, locked, tgz, out)
        await receive_files(node, inputs_hash, _file(out))
    marker.write_text(inputs_hash)
    return Contexts(inputs_hash=inputs_hash, package_hash=package_hash)


def _write_inputs(locked: list[Path], tgz: Path, out: BinaryIO) -> str:
    ci.write_inputs_tar(locked, tgz, out)
    out.seek(0)
    digest = hashlib.sha256()
    while chunk := out.read(CHUNK):
        digest.update(chunk)
    out.seek(0)
    return digest.hexdigest()


async def _bytes(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _file(fh: BinaryIO) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(fh.read, CHUNK):
        yield chunk
