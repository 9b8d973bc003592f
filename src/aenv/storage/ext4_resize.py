"""Growing the ext4 inside a workspace image whose file has already grown.

Online (mounted): ``losetup --set-capacity`` so the loop device sees the new size, then
``resize2fs`` on the device; the kernel's online resize demands CAP_SYS_RESOURCE, which
containers often drop (this CI host does). Offline: ``e2fsck -f -p`` (resize2fs refuses a
filesystem not checked since its last mount; ``-p`` fixes only what is safe without asking
and fails on anything worse), ``resize2fs`` of the file, and an fsync of it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, FailedPrecondition
from aenv.storage import loopdev

#: resize2fs and e2fsck of a sparse image take well under a second; a minute means a hang.
RESIZE_TIMEOUT_S = 60.0


def has_cap_sys_resource() -> bool:
    """Bit 24 of this process's effective capabilities."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def refuse_online_without_cap(what: str) -> None:
    if not has_cap_sys_resource():
        raise FailedPrecondition(f"online resize of {what} needs CAP_SYS_RESOURCE, which this "
                                 "process lacks: detach it and grow it offline")


async def grow_online(device: str, what: str) -> None:
    resize2fs = loopdev.require_tool("resize2fs", "e2fsprogs")
    await loopdev.set_capacity(device)
    try:
        await proc.run([resize2fs, device], timeout=RESIZE_TIMEOUT_S)
    except CommandError as exc:
        if "Permission denied" in exc.stderr:
            raise FailedPrecondition(f"online resize of {what} needs CAP_SYS_RESOURCE: "
                                     "detach it and grow it offline") from exc
        raise


async def grow_offline(image: Path) -> None:
    resize2fs = loopdev.require_tool("resize2fs", "e2fsprogs")
    e2fsck = loopdev.require_tool("e2fsck", "e2fsprogs")
    await proc.run([e2fsck, "-f", "-p", str(image)], timeout=RESIZE_TIMEOUT_S)
    await proc.run([resize2fs, str(image)], timeout=RESIZE_TIMEOUT_S)
    await asyncio.to_thread(fsync_file, image)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
