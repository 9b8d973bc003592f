"""A sandbox's disk image as repository blobs: fixed-size chunks, and only changed ones read.

A disk image (``storage/workspaces.py``) is cut into :data:`CHUNK_BYTES` chunks; each chunk
that holds data is a blob (its sha256), chunks that are holes are left out, and the manifest
lists ``(index, digest)`` plus the image's size. Equal chunks are stored once, across snapshots
and sandboxes.

What makes a snapshot cost what changed rather than what the disk holds: the image exported
is a reflink clone, and so is the previous export of the same sandbox, kept on the pool. A
chunk whose extents (``FIEMAP``: logical → physical) are the same in both clones shares its
blocks with the previous export, so its bytes are the same: its digest is reused without
reading it. Only chunks with other extents are read and hashed. The previous clone is kept
exactly so that its blocks cannot be reused for other data in between.

Owns ``<home>/cache/disks/<sandbox_id>.json`` (the previous export's chunk table and extent
signatures) and nothing else; the clone files belong to the caller.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

from aenv.storage.blobs import BlobCache

#: 4 MiB: big enough that a 4 GiB disk is 1,024 blobs, small enough that 10 MiB changed
#: costs about 12 MiB of reads and puts.
CHUNK_BYTES = 4 << 20

_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_HEADER = struct.Struct("=QQIIII")
_EXTENT = struct.Struct("=QQQQQIIII")
_BATCH = 512

#: (logical start, physical start, length) of the extents that overlap one chunk.
Signature = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Chunk:
    index: int
    digest: str
    size: int


@dataclass(frozen=True)
class DiskExport:
    size: int
    chunks: tuple[Chunk, ...]
    #: Chunks read (changed since the previous export, or all on the first).
    read: int
    reused: int


def extents(path: Path) -> list[tuple[int, int, int]]:
    """Every extent of the file (``FIEMAP`` with a sync first), logical order."""
    found: list[tuple[int, int, int]] = []
    start = 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while True:
            buffer = bytearray(_HEADER.size + _EXTENT.size * _BATCH)
            _HEADER.pack_into(buffer, 0, start, (1 << 64) - 1 - start, _FIEMAP_FLAG_SYNC, 0,
                              _BATCH, 0)
            raw = array.array("B", buffer)
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, raw, True)
            data = raw.tobytes()
            mapped = _HEADER.unpack_from(data, 0)[3]
            last = False
            for n in range(mapped):
                logical, physical, length, _r1, _r2, flags, *_ = _EXTENT.unpack_from(
                    data, _HEADER.size + n * _EXTENT.size)
                found.append((logical, physical, length))
                start = logical + length
                last = bool(flags & _FIEMAP_EXTENT_LAST)
            if last or mapped == 0:
                return found
    finally:
        os.close(fd)


def signatures(path: Path) -> dict[int, Signature]:
    """Per chunk index with data, the extents overlapping it (clipped to the chunk)."""
    by_chunk: dict[int, list[tuple[int, int, int]]] = {}
    for logical, physical, length in extents(path):
        end = logical + length
        first, last = logical // CHUNK_BYTES, (end - 1) // CHUNK_BYTES
        for index in range(first, last + 1):
            lo = max(logical, index * CHUNK_BYTES)
            hi = min(end, (index + 1) * CHUNK_BYTES)
            by_chunk.setdefault(index, []).append((lo, physical + (lo - logical), hi - lo))
    return {index: tuple(parts) for index, parts in by_chunk.items()}


def export_disk(image: Path, cache: BlobCache, index_file: Path, pin: Path) -> DiskExport:
    """Cut the (quiesced) clone ``image`` into chunk blobs in ``cache`` (blocking).

    ``index_file`` holds the previous export of the same disk, whose clone the caller kept at
    ``pin``; chunks whose extents did not change since are not read. Extents are compared
    only while that very file (same inode) still exists: once it is gone its blocks may hold
    other data. On success ``index_file`` describes this export, and the caller must keep
    ``image`` itself at ``pin`` (a rename keeps the inode) until the next export.
    """
    size = image.stat().st_size
    previous = _load(index_file, pin)
    current = signatures(image)
    chunks: list[Chunk] = []
    table: dict[str, list[object]] = {}
    read = reused = 0
    with open(image, "rb", buffering=0) as f:
        for index in sorted(current):
            signature = current[index]
            known = previous.get(str(index))
            if known is not None and _as_signature(known[2]) == signature and cache.has(
                    str(known[0])):
                chunk = Chunk(index, str(known[0]), int(known[1]))  # type: ignore[call-overload]
                reused += 1
            else:
                chunk = _store_chunk(f, index, size, cache)
                read += 1
            chunks.append(chunk)
            table[str(index)] = [chunk.digest, chunk.size, [list(e) for e in signature]]
    _save(index_file, {"pin": image.stat().st_ino, "chunks": table})
    return DiskExport(size, tuple(chunks), read, reused)


def _store_chunk(f: object, index: int, size: int, cache: BlobCache) -> Chunk:
    length = min(CHUNK_BYTES, size - index * CHUNK_BYTES)
    data = os.pread(f.fileno(), length, index * CHUNK_BYTES)  # type: ignore[attr-defined]
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if not cache.has(digest):
        cache.root.mkdir(parents=True, exist_ok=True)
        scratch = cache.root / f".chunk-{secrets.token_hex(6)}"
        try:
            scratch.write_bytes(data)  # hashed above, from these very bytes
            cache.place(scratch, cache.path(digest))
        finally:
            with contextlib.suppress(FileNotFoundError):
                scratch.unlink()
    return Chunk(index, digest, len(data))


def assemble_disk(dest: Path, size: int, chunks: list[tuple[int, Path]]) -> None:
    """Write a disk image of ``size`` from chunk files at their indexes (blocking); the rest
    stays holes. Made under a temporary name and renamed: a crash leaves no half image."""
    temporary = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}")
    try:
        with open(temporary, "wb") as out:
            out.truncate(size)
            for index, path in chunks:
                os.pwrite(out.fileno(), path.read_bytes(), index * CHUNK_BYTES)
            os.fsync(out.fileno())
        temporary.rename(dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def _as_signature(raw: object) -> Signature:
    if not isinstance(raw, list):
        return ()
    parts: list[tuple[int, int, int]] = []
    for entry in raw:
        if not isinstance(entry, list) or len(entry) != 3:
            return ()
        parts.append((int(entry[0]), int(entry[1]), int(entry[2])))
    return tuple(parts)


def _load(index_file: Path, pin: Path) -> dict[str, list[object]]:
    try:
        data = json.loads(index_file.read_text())
        pinned = pin.stat().st_ino
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("pin") != pinned:
        return {}
    chunks = data.get("chunks")
    return chunks if isinstance(chunks, dict) else {}


def _save(index_file: Path, table: dict[str, object]) -> None:
    index_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = index_file.with_name(f".{index_file.name}.{secrets.token_hex(4)}")
    temporary.write_text(json.dumps(table))
    temporary.replace(index_file)

