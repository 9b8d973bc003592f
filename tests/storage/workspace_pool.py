"""Workspace pools on real loop devices for storage tests: a store on an XFS pool image in a
throwaway home (``conftest.py`` makes the ``home`` and ``store`` fixtures of them), what a
test may leave mounted or attached, and ``dd`` into a workspace."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from aenv.core import proc
from aenv.storage import loopdev
from aenv.storage.mounts import mounts_under
from aenv.storage.reflink_fs import ReflinkPool
from aenv.storage.workspaces import WorkspaceStore

POOL_BYTES = 1 << 30


def leftovers(home: Path) -> list[str]:
    return mounts_under(home) + [loop.device for loop in loopdev.loops_under(home)]


def leftovers_settled(home: Path) -> list[str]:
    # A loop device with autoclear goes after its last unmount and its last opener (udev's
    # probe of a new device is one): a moment, seconds on a loaded machine (a CI run saw one
    # still there after 2 s beside two other shards).
    deadline = time.monotonic() + 10.0
    while (found := leftovers(home)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def force_clean(home: Path) -> None:
    for mount_point in mounts_under(home):
        subprocess.run(["umount", "--lazy", mount_point], check=False, capture_output=True)
    for loop in loopdev.loops_under(home):
        subprocess.run(["losetup", "-d", loop.device], check=False, capture_output=True)


async def workspace_store(home: Path, **kwargs: object) -> WorkspaceStore:
    pool = ReflinkPool(home, backing="image", image_size_bytes=POOL_BYTES)
    await pool.start()
    return WorkspaceStore(pool, **kwargs)  # type: ignore[arg-type]


async def dd(dest: Path, mb: int, source: str = "/dev/zero") -> proc.Completed:
    argv = ["dd", f"if={source}", f"of={dest}", "bs=1M", f"count={mb}", "conv=fsync"]
    return await proc.run(argv, timeout=60, check=False)
