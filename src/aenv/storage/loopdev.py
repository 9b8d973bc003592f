"""Loop devices: attach an image file as a block device, find what a file backs, detach.

Owns no path: it attaches and detaches ``/dev/loopN`` devices for the files its callers name
(the node's workspace pool image, one ext4 image per sandbox) and reads the kernel's view of
them from ``/sys/block/loop*/loop/``, which needs no subprocess and survives a server restart.

Attach protocol used by every caller (``attach`` → ``mount`` → ``release``): ``losetup -d`` of a
device that is held open (mounted) does not detach it but sets *autoclear*, so the device goes
away by itself at the last unmount. Until the release a crash can leave an attached, unmounted
device behind; :func:`loops_backed_by` finds it and :func:`detach` removes it (recovery).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, FailedPrecondition

#: losetup only talks to the loop driver; longer means the backing file's filesystem hangs.
LOSETUP_TIMEOUT_S = 30.0
#: What losetup/the kernel answer when the device is not attached (any more) or does not exist.
_ALREADY_DETACHED = ("No such device or address", "No such file or directory", "No such device")
_SYS_BLOCK = "/sys/block"
_DELETED = " (deleted)"
_PARTITIONS = "/proc/partitions"
#: How often :func:`wait_released` looks at sysfs again: first, and at the most.
_RELEASE_POLL_S = 0.01
_RELEASE_POLL_MAX_S = 0.05


def require_tool(name: str, package: str) -> str:
    """The path of command ``name``, or :class:`FailedPrecondition` naming its Debian package."""
    found = shutil.which(name)
    if found is None:
        raise FailedPrecondition(
            f"{name} not found on this host: install the Debian package {package} "
            "(scripts/install-system-deps.sh does)"
        )
    return found


@dataclass(frozen=True)
class LoopDevice:
    """An attached loop device as ``/sys/block/loopN/loop/`` shows it."""

    device: str
    #: Absolute path of the backing file as the kernel resolved it at attach time.
    backing_file: str
    #: The backing file was unlinked while attached (the kernel appends "(deleted)").
    deleted: bool
    #: Detaches by itself at the last close (set by :func:`release`, or ``mount -o loop``).
    autoclear: bool
    #: I/O bypasses the page cache of the backing file's filesystem.
    direct_io: bool


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read().rstrip("\n")
    except (FileNotFoundError, NotADirectoryError, ProcessLookupError, OSError):
        return None


def list_loops(sys_block: str = _SYS_BLOCK, partitions: str = _PARTITIONS) -> list[LoopDevice]:
    """Every attached loop device of this host (a detached one has no ``backing_file``).

    Only the devices ``/proc/partitions`` lists are read: it names every block device with a
    size, and a loop device has one from its attach to its detach (the kernel zeroes it in
    the same step that clears the backing file; one attached to an empty file has none, and
    no image of ours is empty). A host keeps every loop device it ever
    made (168 here after a day of tests, 6 attached): reading each one's sysfs took ~1.4 ms
    a call, on the node's event loop, several times per workspace attach and detach.

    Prerequisites: sysfs is mounted. On success: the devices, by name. On failure: never
    raises for a device that detaches while we read; an unreadable ``/sys/block`` gives ``[]``.
    """
    names = _sized_loops(partitions)
    if names is None:
        try:
            names = sorted(n for n in os.listdir(sys_block) if n.startswith("loop"))
        except OSError:
            return []
    found: list[LoopDevice] = []
    for name in names:
        base = f"{sys_block}/{name}/loop"
        backing = _read(f"{base}/backing_file")
        if not backing:
            continue
        deleted = backing.endswith(_DELETED)
        found.append(
            LoopDevice(
                device=f"/dev/{name}",
                backing_file=backing.removesuffix(_DELETED),
                deleted=deleted,
                autoclear=_read(f"{base}/autoclear") == "1",
                direct_io=_read(f"{base}/dio") == "1",
            )
        )
    return found


def _sized_loops(partitions: str) -> list[str] | None:
    """Names of the loop devices ``partitions`` lists (those with a size), or None when it
    cannot be read (then every device is looked at)."""
    try:
        with open(partitions, encoding="ascii", errors="replace") as fh:
            rows = fh.read().splitlines()
    except OSError:
        return None
    names = (row.split()[-1] for row in rows[1:] if row.strip())
    return sorted(name for name in names if name.startswith("loop"))


def loops_backed_by(path: Path) -> list[LoopDevice]:
    """Loop devices attached to the file ``path`` (compared by real path)."""
    real = os.path.realpath(path)
    return [loop for loop in list_loops() if loop.backing_file == real]


def loops_under(directory: Path) -> list[LoopDevice]:
    """Loop devices whose backing file is (or was, if deleted) inside ``directory``."""
    real = os.path.realpath(directory)
    return [loop for loop in list_loops() if loop.backing_file.startswith(real + "/")]


async def attach(path: Path, *, direct_io: bool = True) -> str:
    """Attach the file ``path`` to a free loop device.

    Prerequisites: root; ``path`` is a regular file. ``direct_io`` avoids caching every block
    twice (once for the filesystem inside, once for the file's own filesystem).
    On success: the device path (``/dev/loopN``), attached without autoclear: the caller mounts
    it and then calls :func:`release`, or :func:`detach` if the mount fails.
    On failure: :class:`FailedPrecondition` if losetup is missing; ``CommandError`` otherwise
    (no free device: losetup adds one through /dev/loop-control, so that means a kernel limit).
    """
    losetup = require_tool("losetup", "mount")
    argv = [losetup, "--find", "--show"]
    if direct_io:
        argv.append("--direct-io=on")
    argv.append(os.fspath(path))
    done = await proc.run(argv, timeout=LOSETUP_TIMEOUT_S)
    device = done.text.strip()
    if not device.startswith("/dev/loop"):
        raise CommandError(argv, 0, f"unexpected losetup output {device!r}")
    return device


async def release(device: str) -> None:
    """Let ``device`` detach by itself at its last unmount (``losetup -d`` of an open device).

    Prerequisites: ``device`` is mounted (held open); otherwise this detaches it at once.
    On success: autoclear is set. On failure: ``CommandError``; a device that is already gone
    counts as done.
    """
    await detach(device)


async def detach(device: str) -> None:
    """Detach ``device`` (or mark it autoclear if it is still open). Idempotent.

    On success: the device is free, or will be at its last close. On failure:
    ``CommandError``; "not attached" or "no such device" count as done.
    """
    losetup = require_tool("losetup", "mount")
    try:
        await proc.run([losetup, "--detach", device], timeout=LOSETUP_TIMEOUT_S)
    except CommandError as exc:
        if any(text in exc.stderr for text in _ALREADY_DETACHED):
            return
        raise


async def detach_left(path: Path) -> None:
    """Detach the loop devices a crash left attached to ``path`` and never released.

    Only those: a released device (autoclear) goes by itself at its last close, and may be
    gone and attached to another file between our look at sysfs and a ``losetup -d`` by its
    number, which would then detach that file's new device under its mount ("can't read
    superblock": seen once kills answered before their release, so that releases and
    attaches overlap)."""
    for loop in loops_backed_by(path):
        if not loop.autoclear:
            await detach(loop.device)


async def wait_released(path: Path, timeout_s: float) -> list[LoopDevice]:
    """Wait until no loop device is attached to the file ``path``; those left at the deadline.

    Why: an unmount that returns has not always ended the file system. An ext4 under an
    overlay is held by the overlay's private clone of its mount, and the kernel drops that
    clone from a workqueue after the overlay's unmount has returned; until then the ext4 is
    alive, not yet written back, its device open, so ``losetup -d`` only sets autoclear. A
    second device attached to the image meanwhile mounts a second live copy of the same file
    system, and each overwrites the other's metadata (ext4: "deleted inode referenced",
    "Structure needs cleaning"). The device going away means the file system's last write
    is done.
    """
    deadline = time.monotonic() + timeout_s
    poll = _RELEASE_POLL_S
    while True:
        left = loops_backed_by(path)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(poll)
        poll = min(poll * 1.5, _RELEASE_POLL_MAX_S)


async def set_capacity(device: str) -> None:
    """Make ``device`` pick up its backing file's new size (after the file grew)."""
    losetup = require_tool("losetup", "mount")
    await proc.run([losetup, "--set-capacity", device], timeout=LOSETUP_TIMEOUT_S)
