"""Clean-up is idempotent: what another process unmounted or removed first counts as done.

Reproduces the race a node met when it started while its predecessor was still shutting down
("umount …/rootfs: not mounted"): two unmounts of the same mount point, both issued while it
was still mounted.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from aenv.core.errors import Conflict
from aenv.storage.mounts import read_mountinfo, unmount

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root"),
]


def _mounted(path: Path) -> bool:
    return any(m.mount_point == str(path) for m in read_mountinfo())


@pytest.mark.parametrize("lazy", [False, True])
async def test_two_unmounts_racing_both_succeed(tmp_path: Path, lazy: bool) -> None:
    target = tmp_path / "rootfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    try:
        await asyncio.gather(*(unmount(str(target), lazy=lazy, what="t") for _ in range(2)))
        assert not _mounted(target)
    finally:
        if _mounted(target):
            subprocess.run(["umount", "-l", str(target)], check=False)


async def test_unmount_of_what_is_not_mounted_or_gone_is_done(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    await unmount(str(tmp_path / "empty"), lazy=False, what="t")
    await unmount(str(tmp_path / "missing"), lazy=True, what="t")


async def test_a_busy_mount_is_not_taken_for_gone(tmp_path: Path) -> None:
    target = tmp_path / "rootfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(target)], check=True)
    user = subprocess.Popen(["sleep", "60"], cwd=target)
    try:
        with pytest.raises(Conflict):
            await unmount(str(target), lazy=False, what="t")
        assert _mounted(target)
    finally:
        user.kill()
        user.wait()
        subprocess.run(["umount", "-l", str(target)], check=False)
