"""What the code-interpreter template is built from, fetched by the node: the locked wheels
(``pip download`` with the node's own pip configuration, so its index, mirror, proxy and CA
apply), Deno's tarball (checked against the npm registry's integrity hash) and R's Debian
packages (``interpreter_debs.py``), kept under ``<home>/cache/code-interpreter`` so a
rebuild downloads nothing; then the three build contexts (``templates/code_interpreter.py``)
stored as a build's uploads.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import httpx

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops import interpreter_debs
from aenv.orchestrator.ops.template_files import receive_files
from aenv.templates import code_interpreter as ci

#: A cold download is ~70 MB of wheels and ~45 MB of Deno.
DOWNLOAD_TIMEOUT_S = 900.0
CHUNK = 1 << 20

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Contexts:
    r_hash: str
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
    """Fetch what is missing, then store the contexts as build uploads; their hashes."""
    cache = cache_dir(node)
    cache.mkdir(parents=True, exist_ok=True)
    package = await asyncio.to_thread(ci.package_tar, ci.server_package())
    package_hash = hashlib.sha256(package).hexdigest()
    await receive_files(node, package_hash, _bytes(package))
    base = await interpreter_debs.base_system(node)
    r_key = await asyncio.to_thread(base.key)
    # Each big context (~50 MB of debs, ~115 MB of wheels and Deno) is made (and Deno's
    # tarball re-checked) once per key, not at every start; its marker names the upload.
    lock_key = hashlib.sha256(repr((ci.PIP_LOCK, ci.DENO_INTEGRITY)).encode()).hexdigest()

    async def inputs() -> tuple[list[Path], Path]:
        return await _all(wheels(cache), deno(cache))

    r_hash, inputs_hash = await _all(
        _context(node, cache / f"r-{r_key[:16]}.sha256",
                 lambda: interpreter_debs.debs(cache, base, r_key), ci.write_debs_tar),
        _context(node, cache / f"inputs-{lock_key[:16]}.sha256", inputs,
                 lambda fetched, out: ci.write_inputs_tar(*fetched, out)))
    return Contexts(r_hash=r_hash, inputs_hash=inputs_hash, package_hash=package_hash)


async def _context(node: Node, marker: Path, fetch: Callable[[], Awaitable[T]],
                   write: Callable[[T, BinaryIO], None]) -> str:
    """The upload ``marker`` names if it is still there; else ``write(await fetch())``
    uploaded, and named by ``marker``."""
    known = marker.read_text().strip() if marker.is_file() else ""
    if known and (node.builder.files_dir / known).is_file():
        return known
    fetched = await fetch()
    with tempfile.TemporaryFile(dir=marker.parent) as out:
        digest = await asyncio.to_thread(_write_hashed, write, fetched, out)
        await receive_files(node, digest, _file(out))
    marker.write_text(digest)
    return digest


def _write_hashed(write: Callable[[T, BinaryIO], None], fetched: T, out: BinaryIO) -> str:
    write(fetched, out)
    out.seek(0)
    digest = hashlib.sha256()
    while chunk := out.read(CHUNK):
        digest.update(chunk)
    out.seek(0)
    return digest.hexdigest()


async def _all(first: Awaitable[T], second: Awaitable[U]) -> tuple[T, U]:
    """Both, side by side; the first failure cancels the other (``gather`` would leave it
    running, and the retry would meet its apt or pip still writing the cache)."""
    one, two = asyncio.ensure_future(first), asyncio.ensure_future(second)
    try:
        await asyncio.wait((one, two), return_when=asyncio.FIRST_EXCEPTION)
        for task in (one, two):
            if task.done() and (exc := task.exception()) is not None:
                raise exc
        return one.result(), two.result()
    finally:
        for task in (one, two):
            task.cancel()
        await asyncio.gather(one, two, return_exceptions=True)


async def _bytes(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _file(fh: BinaryIO) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(fh.read, CHUNK):
        yield chunk
