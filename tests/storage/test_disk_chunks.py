"""A disk image as chunk blobs: only chunks whose extents changed since the previous export
are read, and the chunks put back together give the image byte for byte."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from aenv.storage.blobs import BlobCache
from aenv.storage.disk_chunks import CHUNK_BYTES, assemble_disk, export_disk
from aenv.storage.workspaces import WorkspaceStore
from tests.storage.workspace_pool import dd

pytestmark = [pytest.mark.anyio]


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


async def test_a_second_export_reads_only_what_changed(store: WorkspaceStore,
                                                       home: Path) -> None:
    cache = BlobCache(home / "cache" / "blobs")
    cache.start()
    index = home / "cache" / "disks" / "s1.json"
    clones = store.pool.path / "clones"
    clones.mkdir()
    pin = clones / "s1.last.img"
    await store.create("s1", 256)
    mounted = await store.attach("s1")
    assert (await dd(mounted / "upper" / "big", 64, "/dev/urandom")).returncode == 0
    first_clone = await store.clone_frozen("s1", clones / "s1.1.img")
    first = await asyncio.to_thread(export_disk, first_clone, cache, index, pin)
    first_clone.rename(pin)
    assert first.reused == 0 and first.read >= 64 * (1 << 20) // CHUNK_BYTES

    # 1 MiB changed in the middle of the big file.
    argv_ok = await _dd_at(mounted / "upper" / "big", offset_mb=30, mb=1)
    assert argv_ok
    second_clone = await store.clone_frozen("s1", clones / "s1.2.img")
    second = await asyncio.to_thread(export_disk, second_clone, cache, index, pin)
    # The changed data, plus the filesystem's own metadata (journal, inode, bitmaps).
    assert second.read <= 8, second
    assert second.reused >= first.read - 8

    rebuilt = home / "rebuilt.img"
    parts = [(c.index, cache.path(c.digest)) for c in second.chunks]
    await asyncio.to_thread(assemble_disk, rebuilt, second.size, parts)
    assert _md5(rebuilt) == _md5(second_clone)

    # Without the pinned clone, extents prove nothing: everything is read again.
    pin.unlink()
    third = await asyncio.to_thread(export_disk, second_clone, cache, index, pin)
    assert third.reused == 0
    await store.detach("s1")


async def _dd_at(path: Path, *, offset_mb: int, mb: int) -> bool:
    from aenv.core import proc

    argv = ["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"seek={offset_mb}",
            f"count={mb}", "conv=notrunc,fsync"]
    return (await proc.run(argv, timeout=60, check=False)).returncode == 0
