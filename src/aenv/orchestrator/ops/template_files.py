"""A build's uploaded files: the SDK's tarball of each COPY's sources (and ``aenv template
build``'s context), kept by content hash in the builder's ``files_dir``.

Owns ``<files_dir>/<filesHash>`` and ``<files_dir>/.upload-*``. An upload is written to a
private ``.upload-<random>`` file, synced, then renamed onto its hash: a file under its hash is
always whole, and a crash leaves only a ``.upload-*`` that the node sweeps at start
(``server.py``). The hash is the SDK's name for the upload, not checked against the bytes
here: the COPY step reads the tarball as untrusted input whatever it holds.

File work runs in worker threads: an upload may be gigabytes, and the event loop serves
every sandbox of the node.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aenv.core.errors import NotEnoughSpace
from aenv.core.unwind import to_the_end
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.template_catalog import building, require_template
from aenv.templates.e2b_steps import check_files_hash

#: Bytes gathered before one write in a worker thread: the request's chunks are ~64 KiB, and
#: a thread hop per chunk would cost more than the write.
WRITE_BYTES = 1 << 20


@dataclass(frozen=True)
class UploadTarget:
    #: The template's id (the request may name it by name): what an upload URL is signed for.
    template_id: str
    #: The files are on this node already: no upload needed.
    present: bool


async def upload_target(node: Node, template_id: str, files_hash: str) -> UploadTarget:
    """Whether the files ``files_hash`` of a template's build must be uploaded.

    Prerequisites: the template exists; ``files_hash`` is 64 lowercase hex digits.
    On success: the template's id and whether the files are here already.
    On failure: ``NotFound``, ``InvalidArgument`` (hash). Reads only.
    """
    store, builder = building(node)
    record = await require_template(store, template_id)
    check_files_hash(files_hash)
    present = await asyncio.to_thread((builder.files_dir / files_hash).is_file)
    return UploadTarget(record.template_id, present)


async def receive_files(node: Node, files_hash: str, chunks: AsyncIterable[bytes], *,
                        declared: int | None = None) -> None:
    """Store an upload of the files ``files_hash`` as it streams in.

    Prerequisites: the caller checked the upload's signature; ``declared`` (the request's
    Content-Length, if any) and the bytes sent are within ``max_upload_bytes``.
    On success: ``<files_dir>/<files_hash>`` holds the bytes, synced (a second upload of the
    same hash replaces it whole).
    On failure: ``InvalidArgument`` (hash), ``NotEnoughSpace`` (507: over the limit, declared
    or sent), ``OSError`` (the disk); no partial file is left, and
    the hash's file is whole or absent (a cancel during the final sync may still complete it).
    A crash leaves a ``.upload-*`` file, removed at the next start.
    """
    check_files_hash(files_hash)
    limit = node.settings.max_upload_bytes
    if declared is not None and declared > limit:
        raise NotEnoughSpace(f"upload of {declared} bytes exceeds the limit of {limit}")
    _, builder = building(node)
    files = builder.files_dir
    partial = files / f".upload-{secrets.token_hex(8)}"
    fh = await asyncio.to_thread(_open, partial)
    try:
        written = 0
        pending: list[bytes] = []
        size = 0
        async for chunk in chunks:
            written += len(chunk)
            if written > limit:
                raise NotEnoughSpace(f"upload exceeds the limit of {limit} bytes")
            pending.append(chunk)
            size += len(chunk)
            if size >= WRITE_BYTES:
                # To its end even if cancelled: the clean-up must not close the file under
                # a write still running in its thread.
                await to_the_end(asyncio.to_thread(fh.write, b"".join(pending)))
                pending, size = [], 0
        await to_the_end(
            asyncio.to_thread(_finish, fh, b"".join(pending), partial, files / files_hash))
    finally:
        await to_the_end(asyncio.to_thread(_discard, fh, partial))


def _open(partial: Path) -> BinaryIO:
    partial.parent.mkdir(parents=True, exist_ok=True)
    return open(partial, "wb")


def _finish(fh: BinaryIO, tail: bytes, partial: Path, final: Path) -> None:
    fh.write(tail)
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    partial.replace(final)


def _discard(fh: BinaryIO, partial: Path) -> None:
    """Close and remove what is left of the upload (nothing after ``_finish``)."""
    fh.close()
    partial.unlink(missing_ok=True)
