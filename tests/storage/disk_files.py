"""Files that stand in for a sandbox disk's reflink clones in storage tests, and the chunk
digests a disk export of them must give."""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from aenv.storage.disk_chunks import CHUNK_BYTES


def clone_file(directory: Path, name: str, chunks: int = 3) -> tuple[Path, bytes]:
    """A file standing in for a reflink clone of a disk: random data, whole chunks."""
    data = secrets.token_bytes(chunks * CHUNK_BYTES)
    path = directory / name
    path.write_bytes(data)
    return path, data


def chunk_digests(data: bytes) -> list[str]:
    return ["sha256:" + hashlib.sha256(data[i:i + CHUNK_BYTES]).hexdigest()
            for i in range(0, len(data), CHUNK_BYTES)]
