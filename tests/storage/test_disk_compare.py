"""Two frozen clones of one disk are told the same exactly when the sandbox wrote nothing in
between (``storage/disk_compare.py``, which lets a fork's children be made ahead)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.storage.disk_compare import mapped_apart, same_files
from aenv.storage.workspaces import WorkspaceStore
from tests.storage.workspace_pool import dd

pytestmark = [pytest.mark.anyio]


def test_ranges_mapped_apart_ignore_where_the_extents_are_cut() -> None:
    a = [(0, 1000, 4096), (4096, 5096, 8192), (16384, 90000, 4096)]
    # The same mapping cut elsewhere, one block moved, and one more block with data.
    b = [(0, 1000, 8192), (8192, 7000, 4096), (16384, 90000, 4096), (40960, 10, 4096)]
    assert list(mapped_apart(a, b)) == [(8192, 12288), (40960, 45056)]
    assert list(mapped_apart(a, a)) == []


async def test_clones_of_an_idle_disk_are_the_same_and_one_write_makes_them_differ(
        store: WorkspaceStore) -> None:
    clones = store.pool.path / "clones"
    clones.mkdir()
    await store.create("s1", 256)
    mounted = await store.attach("s1")
    assert (await dd(mounted / "upper" / "data", 8, "/dev/urandom")).returncode == 0
    first = await store.clone_frozen("s1", clones / "a.img")
    await asyncio.sleep(0.5)
    # Reading changes nothing (noatime); every freeze and thaw rewrites the superblock.
    (mounted / "upper" / "data").read_bytes()
    second = await store.clone_frozen("s1", clones / "b.img")
    assert await asyncio.to_thread(same_files, first, second)

    (mounted / "upper" / "note").write_text("x")
    third = await store.clone_frozen("s1", clones / "c.img")
    assert not await asyncio.to_thread(same_files, first, third)
    assert not await asyncio.to_thread(same_files, second, third)


def test_files_that_differ_only_in_their_first_block_count_as_the_same(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A" * 4096 + b"same" * 4096)
    b.write_bytes(b"B" * 4096 + b"same" * 4096)
    assert same_files(a, b)
    b.write_bytes(b"B" * 4096 + b"same" * 4095 + b"diff")
    assert not same_files(a, b)
