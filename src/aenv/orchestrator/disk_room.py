"""Refuse a checkpoint that cannot fit on its disk, before the sandbox is touched.

A sandbox does not survive a checkpoint that runs out of space (the driver's save fails
half-way, "no space left on device", and the sandbox exits: RUNTIME-NOTES) — a pause's spill
would lose the sandbox it was keeping. So every checkpoint first compares the free space of its
target filesystem with what the image can take: the sandbox's memory use as its memory cgroup
counts it (the image holds at most that: guest memory and the files written into it), plus a
margin. Too little → :class:`NotEnoughSpace` (507) naming both figures, and nothing has happened
to the sandbox."""

from __future__ import annotations

import os
from pathlib import Path

from aenv.core.errors import NotEnoughSpace
from aenv.runtime.base import Instance, Runtime

#: Room kept free beyond the estimate (the image's metadata; other writers on the disk).
MARGIN_BYTES = 32 << 20


def ensure_room(runtime: Runtime, instance: Instance, directory: Path, what: str) -> None:
    """Raise :class:`NotEnoughSpace` if ``directory``'s filesystem cannot take the image."""
    need = runtime.memory_charged(instance)
    if need is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    fs = os.statvfs(directory)
    free = fs.f_bavail * fs.f_frsize
    if free < need + MARGIN_BYTES:
        raise NotEnoughSpace(
            f"not enough disk space for {what}: {free / 1e6:.0f} MB free in {directory}, "
            f"the memory image may take {need / 1e6:.0f} MB; the sandbox keeps running")
