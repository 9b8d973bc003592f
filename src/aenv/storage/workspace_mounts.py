"""Attaching one workspace image to the host: a loop device, an ext4 mount, freeze and thaw.

Attached = loop device (``losetup --direct-io=on``) + ext4 mount at the mount point the caller
names (:class:`aenv.storage.workspaces.WorkspaceStore` uses ``<home>/workspaces-mnt/<id>``);
the loop device is released right after the mount (autoclear), so unmounting frees it. The
mount table and ``/sys/block/loop*`` are the truth for what is attached, and every clean-up
step counts "already gone" as done.

Owns the mount point directory and the ``upper/`` and ``work/`` directories inside a mounted
image, and nothing else: which image belongs to which sandbox, locking and space are the
store's. Callers serialize the operations on one image (the store holds its sandbox's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import time
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, CommandTimeout, Conflict
from aenv.storage import loopdev
from aenv.storage.mounts import MOUNT_TIMEOUT_S, read_mountinfo, unmount

#: Names of the overlay directories inside a mounted workspace.
UPPER = "upper"
WORK = "work"
#: A freeze writes back everything the sandbox left dirty; a minute covers GBs.
FREEZE_TIMEOUT_S = 60.0
#: Inner filesystem options: ``discard`` turns guest deletes into holes in the image (pool space
#: comes back, workspace-reflink.md §1); ``noatime`` spares a metadata write per read.
EXT4_MOUNT_OPTIONS = "noatime,discard"
#: An ext4 ends within milliseconds of its last unmount on a quiet host (the kernel finishes
#: it from a workqueue: :func:`aenv.storage.loopdev.wait_released`); longer means something
#: still holds it, and attaching the image again would mount it twice.
RELEASE_TIMEOUT_S = 30.0
_SLOW_RELEASE_S = 1.0
#: ``_IOWR('X', 119, int)`` and ``_IOWR('X', 120, int)`` (linux/fs.h): freeze and thaw a
#: mounted filesystem. Thawing one not frozen is EINVAL, freezing a frozen one EBUSY.
_FIFREEZE = 0xC0045877
_FITHAW = 0xC0045878

log = logging.getLogger("aenv.storage.workspace_mounts")


def mounted_device(mount_point: Path) -> str | None:
    """The device mounted at ``mount_point`` (the topmost one), or None."""
    device = None
    for m in read_mountinfo():
        if m.mount_point == str(mount_point):
            device = m.source  # the last one is on top
    return device


async def mount_image(sandbox_id: str, image: Path, mount_point: Path) -> None:
    """Mount ``image`` (``sandbox_id``'s workspace) at ``mount_point`` (idempotent).

    Prerequisites: the image exists; root; no other operation on this image runs.
    On success: mounted, with ``upper/`` and ``work/`` inside. Already mounted: left as is,
    thawed if a crash left it frozen. Loop devices a crash left unmounted on the image are
    detached first.
    On failure: :class:`Conflict` if something else is mounted there, the image is mounted
    elsewhere or its file system has not ended since its last unmount; ``CommandError`` if
    mount fails (the message is mount's, e.g. a damaged filesystem). The loop device is
    detached again on failure.
    """
    device = mounted_device(mount_point)
    if device is not None:
        if device not in {loop.device for loop in loopdev.loops_backed_by(image)}:
            raise Conflict(f"{mount_point} has {device} mounted, not the workspace {image}")
        await thaw(mount_point)
        _make_dirs(mount_point)
        return
    sources = {m.source for m in read_mountinfo()}
    for loop in loopdev.loops_backed_by(image):
        if loop.device in sources:
            raise Conflict(f"workspace {image} is mounted elsewhere ({loop.device})")
    await loopdev.detach_left(image)
    await wait_released(sandbox_id, image)
    mount_point.mkdir(parents=True, exist_ok=True)
    device = await loopdev.attach(image, direct_io=True)
    try:
        await proc.run(
            ["mount", "-t", "ext4", "-o", EXT4_MOUNT_OPTIONS, device, str(mount_point)],
            timeout=MOUNT_TIMEOUT_S,
        )
    except BaseException:
        await asyncio.shield(loopdev.detach(device))
        raise
    await loopdev.release(device)
    _make_dirs(mount_point)


async def unmount_image(sandbox_id: str, image: Path, mount_point: Path, *,
                        settle: bool) -> None:
    """Unmount ``image`` from ``mount_point`` and free its loop devices (idempotent).

    Prerequisites: nothing uses the mount any more. On success: not mounted, mount point
    directory removed; with ``settle`` also no loop device on the image (its file system has
    ended and its data is on the image). On failure: :class:`Conflict` if the mount is busy or
    the file system outlives ``RELEASE_TIMEOUT_S``; ``CommandError`` otherwise.
    """
    if mounted_device(mount_point) is not None:
        # A frozen filesystem would hang the unmount's final sync.
        await thaw(mount_point)
        await unmount(str(mount_point), lazy=False, what=f"workspace of {sandbox_id}")
    await loopdev.detach_left(image)
    if settle:
        await wait_released(sandbox_id, image)
    with contextlib.suppress(FileNotFoundError):
        mount_point.rmdir()


async def freeze(mount_point: Path) -> None:
    """``FIFREEZE`` (what ``fsfreeze -f`` does): flush the mounted ext4 clean and block its
    writers until :func:`thaw`. One frozen already counts as frozen: only the node freezes
    workspaces, so that is a freeze a node killed mid-fork left (the torture met it as a
    500); the caller's thaw ends both."""
    await _ioctl(_FIFREEZE, mount_point, tolerated=errno.EBUSY)


async def thaw(mount_point: Path) -> None:
    """``FITHAW`` (``fsfreeze -u``); a filesystem that is not frozen counts as thawed."""
    await _ioctl(_FITHAW, mount_point, tolerated=errno.EINVAL)


async def _ioctl(request: int, mount_point: Path, *, tolerated: int) -> None:
    # The ioctl itself, not the fsfreeze tool: two process spawns were ~half of a snapshot's
    # disk clone (~20 ms of ~45). A freeze blocks while it writes back: in a thread. Like
    # the tool's, an ioctl that outlives the timeout cannot be taken back (the kernel does
    # not interrupt it); the caller's thaw follows either way.
    argv = ["fsfreeze", "--freeze" if request == _FIFREEZE else "--unfreeze", str(mount_point)]
    try:
        async with asyncio.timeout(FREEZE_TIMEOUT_S):
            await asyncio.to_thread(_call, request, mount_point)
    except TimeoutError as exc:
        raise CommandTimeout(argv, None, f"no answer within {FREEZE_TIMEOUT_S:.0f} s") from exc
    except OSError as exc:
        if exc.errno != tolerated:
            raise CommandError(argv, None, f"{mount_point}: {exc.strerror}") from exc
        log.info("%s %s: %s (nothing to do)", argv[1], mount_point, exc.strerror)


def _call(request: int, mount_point: Path) -> None:
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, request, 0)
    finally:
        os.close(fd)


async def wait_released(sandbox_id: str, image: Path) -> None:
    """Wait until no loop device is left on ``image``; :class:`Conflict` after
    ``RELEASE_TIMEOUT_S`` (the kernel still holds its file system)."""
    started = time.monotonic()
    left = await loopdev.wait_released(image, RELEASE_TIMEOUT_S)
    waited = time.monotonic() - started
    if left:
        raise Conflict(
            f"the workspace of sandbox {sandbox_id} is still in use by the kernel "
            f"{waited:.0f} s after its unmount ({', '.join(loop.device for loop in left)}); "
            "it is attached again only once that has ended: retry later")
    if waited > _SLOW_RELEASE_S:
        log.warning("the workspace of %s ended %.2f s after its unmount", sandbox_id, waited)


def _make_dirs(mount_point: Path) -> None:
    for name in (UPPER, WORK):
        path = mount_point / name
        with contextlib.suppress(FileExistsError):
            path.mkdir()
            path.chmod(0o755)  # the upper's root is the sandbox's "/": never let umask decide
