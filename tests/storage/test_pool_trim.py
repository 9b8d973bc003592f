"""Freed workspace blocks go back to the host, and the host disk's watermark refuses new disk.

Real loop devices: a 1 GiB XFS pool image under a home in /tmp (ext4 here), ext4 images in it.
What the host holds is the pool image's allocated size (``st_blocks``); each test writes into
a workspace, frees it (a delete inside, a removed image) and checks that the image shrinks
back. The watermark is checked against a small tmpfs whose usage the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aenv.storage.host_disk import RETRY_AFTER_S, HostDiskFull, Watermark, disk_usage
from aenv.storage.workspaces import WorkspaceStore
from tests.storage.workspace_pool import dd, workspace_store

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop devices and mounts need root"),
]

WRITTEN_MB = 256
#: Normally 0.1-0.3 s; the kernel frees a deleted image's blocks late on a loaded host (a
#: CI shard beside crash tests: over 10 s), within the trimmer's eager window.
BACK_WITHIN_S = 30.0
#: What may stay allocated after a trim: XFS log and metadata the writes touched.
SLACK = 48 << 20


def _held(store: WorkspaceStore) -> int:
    return os.stat(store.pool.image).st_blocks * 512


async def _written(store: WorkspaceStore, sandbox_id: str) -> Path:
    upper = await store.attach(sandbox_id) / "upper"
    done = await dd(upper / "big", WRITTEN_MB, "/dev/urandom")
    assert done.returncode == 0, done.stderr
    return upper / "big"


@contextlib.asynccontextmanager
async def _trimming(store: WorkspaceStore, interval_s: float) -> AsyncIterator[None]:
    """The trimmer's loop running as the node runs it."""
    store.trimmer.interval_s = interval_s
    runner = asyncio.create_task(store.trimmer.run())
    try:
        yield
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def _back_to(store: WorkspaceStore, baseline: int, within_s: float) -> float:
    """Seconds until the pool image holds at most ``baseline`` (+ slack) again."""
    started = time.monotonic()
    for _ in range(int(within_s / 0.05)):
        if _held(store) < baseline + SLACK:
            break
        await asyncio.sleep(0.05)
    assert _held(store) < baseline + SLACK, (baseline >> 20, _held(store) >> 20)
    return time.monotonic() - started


async def test_a_removed_workspace_gives_its_blocks_back_to_the_host(home: Path) -> None:
    store = await workspace_store(home)
    assert store.pool.discards()  # XFS passes what it frees on, by itself, at its checkpoints
    async with _trimming(store, 0):  # no regular polls: the remove's request
        await store.create("gone", 512)
        baseline = _held(store)
        await _written(store, "gone")
        assert _held(store) > baseline + (WRITTEN_MB << 20) * 9 // 10
        started = time.monotonic()
        await store.remove("gone")  # attached: the kill of a running sandbox
        assert time.monotonic() - started < 2.0  # the remove never waits for a trim
        await _back_to(store, baseline, BACK_WITHIN_S)


async def test_a_delete_inside_a_workspace_gives_its_blocks_back(home: Path) -> None:
    store = await workspace_store(home)
    await store.create("keep", 512)
    baseline = _held(store)
    big = await _written(store, "keep")
    big.unlink()
    # ext4 discards at its journal commit; a sync of the workspace commits now.
    subprocess.run(["sync", "-f", str(big.parent)], check=True)
    await store.trimmer.trim()
    assert _held(store) < baseline + SLACK, (baseline >> 20, _held(store) >> 20)
    await store.remove("keep")


async def test_a_detached_then_removed_workspace_gives_its_blocks_back(home: Path) -> None:
    store = await workspace_store(home)
    async with _trimming(store, 0):
        await store.create("gone", 512)
        baseline = _held(store)
        await _written(store, "gone")
        await store.detach("gone")  # a pause
        await store.remove("gone")  # then the kill
        await _back_to(store, baseline, BACK_WITHIN_S)


async def test_the_trimmer_polls_for_blocks_freed_behind_its_back(home: Path) -> None:
    store = await workspace_store(home)
    async with _trimming(store, 0.2):
        await store.create("keep", 512)
        baseline = _held(store)
        big = await _written(store, "keep")
        big.unlink()  # nobody asks for a trim: the poll sees the pool use less than it holds
        subprocess.run(["sync", "-f", str(big.parent)], check=True)
        await _back_to(store, baseline, BACK_WITHIN_S)
    await store.remove("keep")


@contextlib.contextmanager
def _small_fs(mb: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="aenv-wm-") as scratch:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", scratch],
                       check=True)
        try:
            yield Path(scratch)
        finally:
            subprocess.run(["umount", scratch], check=True)


def test_the_watermark_refuses_above_and_admits_at_or_below() -> None:
    with _small_fs(64) as fs:
        mark = Watermark(fs, 50)
        assert mark.check("a new sandbox").percent < 1
        (fs / "filler").write_bytes(b"x" * (40 << 20))
        usage = disk_usage(fs)
        assert 60 < usage.percent < 65
        with pytest.raises(HostDiskFull) as refused:
            mark.check("a new sandbox")
        assert refused.value.http_status == 429
        assert refused.value.retry_after_s == RETRY_AFTER_S
        assert "a new sandbox" in refused.value.message
        assert "50% watermark" in refused.value.message
        assert Watermark(fs, 70).check("x").percent == usage.percent
        assert Watermark(fs, 100).check("x")  # 100: never refuses
        (fs / "filler").unlink()
        assert mark.check("a new sandbox").percent < 1
        with pytest.raises(ValueError):
            Watermark(fs, 0)


async def test_the_store_refuses_new_disk_above_the_host_watermark(home: Path) -> None:
    store = await workspace_store(home)
    used = disk_usage(home).percent
    store.host_watermark_percent = max(used - 1, 0.1)
    with pytest.raises(HostDiskFull, match="watermark"):
        await store.create("refused", 64)
    with pytest.raises(HostDiskFull):
        await store.ensure_host_room("resuming a sandbox")
    assert store.observe().images == {}
    store.host_watermark_percent = min(used + 20, 100)
    await store.ensure_host_room("resuming a sandbox")
    await store.create("admitted", 64)
    await store.remove("admitted")
