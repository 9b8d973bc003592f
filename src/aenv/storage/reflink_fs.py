"""The node's reflink filesystem for workspace images: a host XFS/btrfs, else a loop-mounted XFS.

Owns ``<home>/workspaces`` (the mount point or directory, never its contents: those belong to
:class:`aenv.storage.workspaces.WorkspaceStore`) and ``<home>/workspaces.xfs`` and nothing else::

    <home>/workspaces.xfs            sparse XFS image (``mkfs.xfs -m reflink=1``), only when the
                                     home's own filesystem cannot reflink
    <home>/workspaces.xfs.tmp-<hex>  an image being made (renamed into place once mkfs is done)
    <home>/workspaces/               the pool: that image loop-mounted here, or a plain directory
                                     on a reflink-capable filesystem (XFS reflink=1, btrfs), or an
                                     operator's own disk mounted here

:class:`ReflinkPool.start` decides which, and is idempotent across server restarts: a pool already
mounted is reused, an image that exists is mounted, and only a missing image is made. The pool
stays mounted when the server stops (sandboxes, and their loop devices, outlive it);
:meth:`ReflinkPool.unmount` is for tests and node teardown.

:func:`ficlone` is the one copy primitive: ``ioctl(FICLONE)`` shares every extent of a file, so
a copy of a 5 GiB image takes milliseconds and no data blocks (docs/spikes/workspace-reflink.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aenv.core import proc
from aenv.core.errors import CommandError, Conflict, FailedPrecondition, NotEnoughSpace
from aenv.storage import loopdev
from aenv.storage.files import fsync_dirs, listdir
from aenv.storage.mounts import MOUNT_TIMEOUT_S, read_mountinfo, unmount

#: ``_IOW(0x94, 9, int)`` from linux/fs.h; Python's fcntl only has it from 3.12.
FICLONE = 0x40049409
#: errnos meaning "this filesystem (pair) cannot share extents", not "something broke".
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}
#: Default pool image size: this share of the free space of the home's filesystem. The image is
#: sparse and the free space is not reserved, so leave the rest to logs, layers and snapshots.
DEFAULT_IMAGE_FRACTION = 0.8
#: ... and at most this much (mkfs.xfs writes ~0.5 GB of log and metadata for 1 TiB).
DEFAULT_IMAGE_CAP_BYTES = 1 << 40
#: mkfs.xfs refuses filesystems below 300 MB.
MIN_IMAGE_BYTES = 512 << 20
#: mkfs of even a 1 TiB sparse image takes well under a second; more means a hung disk.
MKFS_TIMEOUT_S = 120.0
_IMAGE_NAME = "workspaces.xfs"
_POOL_NAME = "workspaces"
_PROBE_PREFIX = ".reflink-probe-"
#: Pool mount options: atime updates of image files would only cost metadata writes;
#: ``discard``: blocks freed in the pool (a deleted image, holes a sandbox's ext4 punched in
#: its image) become holes in the pool image, so the host gets them back (without it a killed
#: sandbox's written blocks stayed taken on the host for good). XFS sends them after its log
#: checkpoints; :mod:`aenv.storage.pool_trim` hurries that along. Measured on this host, 4 x
#: 512 MiB write+fsync+delete in an image and 2,000 small files: within the noise (±15 %).
_POOL_MOUNT_OPTIONS = "noatime,discard"
#: How long an unmounted pool's loop device may take to go: the kernel frees an autoclear
#: device at its last close, which can come just after ``umount`` returns.
_RELEASE_S = 10.0

PoolBacking = Literal["auto", "dir", "image"]


class NotReflinkable(FailedPrecondition):
    """The filesystem cannot clone files (``FICLONE`` unsupported), so nothing is copy-free."""


def ficlone(src: Path, dst: Path, *, mode: int = 0o600) -> None:
    """Make ``dst`` a new file sharing every extent of ``src`` (blocking: call in a thread).

    Prerequisites: ``src`` and ``dst`` are on the same reflink-capable filesystem; ``dst`` does
    not exist. The caller guarantees nothing writes ``src`` meanwhile (a write during the clone
    may or may not be in the copy).
    On success: ``dst`` exists with ``src``'s content and ``mode``, durable (fsynced; its
    directory entry is the caller's to fsync or rename).
    On failure: ``dst`` does not exist. :class:`NotReflinkable` if the filesystem cannot clone,
    :class:`NotEnoughSpace` if it is full, ``FileExistsError`` if ``dst`` exists, other
    ``OSError`` as raised.
    """
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            fcntl.ioctl(dst_fd, FICLONE, src_fd)
            os.fsync(dst_fd)
        except BaseException as exc:
            os.close(dst_fd)
            with contextlib.suppress(FileNotFoundError):
                dst.unlink()
            if isinstance(exc, OSError) and exc.errno in _NO_REFLINK:
                raise NotReflinkable(
                    f"cannot clone {src} to {dst}: {os.strerror(exc.errno or 0)} "
                    "(the filesystem does not support reflinks)"
                ) from exc
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NotEnoughSpace(f"no space left to clone {src} to {dst}") from exc
            raise
        os.close(dst_fd)
    finally:
        os.close(src_fd)


def supports_reflink(directory: Path) -> bool:
    """Whether files in ``directory`` can be cloned, tried with a 4 KiB probe file.

    Prerequisites: ``directory`` exists and is writable. On success: the answer; the probe
    files are gone. On failure: ``OSError`` if the probe cannot be written at all.
    """
    token = secrets.token_hex(6)
    src = directory / f"{_PROBE_PREFIX}{token}"
    dst = directory / f"{_PROBE_PREFIX}{token}.clone"
    try:
        src.write_bytes(b"\0" * 4096)
        try:
            ficlone(src, dst)
        except NotReflinkable:
            return False
        return True
    finally:
        for path in (dst, src):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


@dataclass(frozen=True)
class PoolState:
    """What :meth:`ReflinkPool.start` found or made."""

    #: ``image``: our loop-mounted XFS image; ``dir``: a directory (or an operator's disk).
    kind: Literal["dir", "image"]
    #: Files in the pool can be cloned (FICLONE); always true for ``image``.
    reflink: bool
    #: The loop device under an ``image`` pool, ``None`` for ``dir``.
    device: str | None


class ReflinkPool:
    """The reflink-capable filesystem of one aenv home (``<home>/workspaces``)."""

    def __init__(
        self,
        home: Path,
        *,
        backing: PoolBacking = "auto",
        image_size_bytes: int | None = None,
        preallocate: bool = False,
    ) -> None:
        # Mount points and loop backing files are reported by real path: resolve once.
        self.home = Path(os.path.realpath(home))
        #: The pool directory (``<home>/workspaces``).
        self.path = self.home / _POOL_NAME
        #: The XFS image used when the home's filesystem cannot reflink.
        self.image = self.home / _IMAGE_NAME
        #: ``auto``: the directory if its filesystem reflinks, else the image; ``dir``: always the
        #: directory (clones then fail with NotReflinkable); ``image``: always the image.
        self.backing: PoolBacking = backing
        #: Size of a new image; ``None``: DEFAULT_IMAGE_FRACTION of the free space, capped.
        self.image_size_bytes = image_size_bytes
        #: Allocate a new image's space up front (``posix_fallocate``), so that the home's
        #: filesystem filling up can never make pool writes fail underneath a sandbox.
        self.preallocate = preallocate
        self._state: PoolState | None = None

    @property
    def state(self) -> PoolState:
        """What :meth:`start` set up; :class:`FailedPrecondition` before it ran."""
        if self._state is None:
            raise FailedPrecondition(f"workspace pool {self.path} is not started")
        return self._state

    async def start(self) -> PoolState:
        """Make ``<home>/workspaces`` a usable pool (idempotent).

        Prerequisites: root when an image must be mounted; the home exists or can be created.
        On success: the pool directory is on a filesystem this host can write; for ``image``
        (and ``auto`` on a filesystem without reflinks) the XFS image is loop-mounted there,
        made first if missing. A pool mounted by a previous server is reused as it is.
        On failure: :class:`FailedPrecondition` if a tool is missing, the image cannot be
        mounted (corrupt: the message says how to repair), or files in the directory would be
        hidden by mounting over them; :class:`NotEnoughSpace` if there is no room for an image;
        :class:`Conflict` if the image is attached somewhere else. Nothing is left half made: an
        image appears only by rename once mkfs has finished.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        self._sweep_probes()
        device = self._mounted_device()
        if self._is_mounted():
            kind: Literal["dir", "image"] = "image" if self._is_our_image(device) else "dir"
        elif self.backing != "dir" and self.image.exists():
            device = await self._mount_image()
            kind = "image"
        elif self.backing == "dir" or (self.backing == "auto" and supports_reflink(self.path)):
            kind, device = "dir", None
        else:
            await self._make_image()
            device = await self._mount_image()
            kind = "image"
        reflink = supports_reflink(self.path)
        if kind == "image" and not reflink:
            raise FailedPrecondition(
                f"pool image {self.image} mounted at {self.path} cannot reflink"
            )
        self._state = PoolState(
            kind=kind, reflink=reflink, device=device if kind == "image" else None
        )
        return self._state

    def close(self) -> None:
        """Forget the pool without unmounting it: sandboxes live on across server restarts."""
        self._state = None

    async def unmount(self) -> None:
        """Unmount our pool image and detach its loop device (tests, node teardown). Idempotent.

        Prerequisites: no workspace of the pool is attached.
        On success: nothing of ours is mounted at the pool directory and no loop device backs
        the image; a pool that is a plain directory or an operator's disk is left alone.
        On failure: :class:`Conflict` if workspaces are still attached or the mount is busy.
        """
        self._state = None
        attached = loopdev.loops_under(self.path)
        if attached and self._is_mounted():
            names = ", ".join(loop.backing_file for loop in attached)
            raise Conflict(f"workspace pool {self.path} still has attached images: {names}")
        if self._is_mounted() and self._is_our_image(self._mounted_device()):
            await unmount(str(self.path), lazy=False, what=f"workspace pool {self.path}")
        await loopdev.detach_left(self.image)
        if left := await loopdev.wait_released(self.image, _RELEASE_S):
            names = ", ".join(loop.device for loop in left)
            raise Conflict(f"workspace pool image {self.image} is still attached to {names}")

    def host_path(self) -> Path:
        """A path on the file system the pool's blocks are taken from: the home's for a pool
        image, the pool's own for a directory or an operator's disk."""
        return self.home if self.state.kind == "image" else self.path

    def discards(self) -> bool:
        """Whether the mounted pool image passes freed blocks to the host by itself (mounted
        ``discard``; a pool mounted by an older aenv is not, until its next mount)."""
        return any(m.mount_point == str(self.path) and "discard" in m.super_options
                   for m in read_mountinfo())

    def capacity_bytes(self) -> int:
        """Size of the pool's filesystem in bytes."""
        st = os.statvfs(self.path)
        return st.f_blocks * st.f_frsize

    def free_bytes(self) -> int:
        """Bytes the pool's filesystem can still allocate."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    # -- inside -------------------------------------------------------------------------------

    def _mount_entry(self) -> tuple[str, str] | None:
        entry = None
        for m in read_mountinfo():
            if m.mount_point == str(self.path):
                entry = (m.source, m.fstype)  # the last one is on top
        return entry

    def _is_mounted(self) -> bool:
        return self._mount_entry() is not None

    def _mounted_device(self) -> str | None:
        entry = self._mount_entry()
        return entry[0] if entry is not None and entry[0].startswith("/dev/loop") else None

    def _is_our_image(self, device: str | None) -> bool:
        return device is not None and any(
            loop.device == device for loop in loopdev.loops_backed_by(self.image)
        )

    def _sweep_probes(self) -> None:
        for name in listdir(self.path):
            if name.startswith(_PROBE_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    (self.path / name).unlink()

    async def _mount_image(self) -> str:
        loopdev.require_tool("mount", "mount")
        if listdir(self.path):
            raise FailedPrecondition(
                f"{self.path} is not empty: mounting the pool image {self.image} over it would "
                "hide its files; move them away"
            )
        for loop in loopdev.loops_backed_by(self.image):
            # A crash between attach and mount left it; one mounted elsewhere is not ours to take.
            if any(m.source == loop.device for m in read_mountinfo()):
                raise Conflict(f"pool image {self.image} is mounted elsewhere ({loop.device})")
        await loopdev.detach_left(self.image)
        device = await loopdev.attach(self.image, direct_io=True)
        try:
            await proc.run(
                ["mount", "-t", "xfs", "-o", _POOL_MOUNT_OPTIONS, device, str(self.path)],
                timeout=MOUNT_TIMEOUT_S,
            )
        except BaseException as exc:
            await asyncio.shield(loopdev.detach(device))
            if isinstance(exc, CommandError):
                raise FailedPrecondition(
                    f"cannot mount the workspace pool image {self.image} ({exc.stderr.strip()}): "
                    f"repair it with `xfs_repair {self.image}`, or delete it, which deletes "
                    "every workspace in it"
                ) from exc
            raise
        await loopdev.release(device)
        return device

    async def _make_image(self) -> None:
        mkfs = loopdev.require_tool("mkfs.xfs", "xfsprogs")
        size = self.image_size_bytes if self.image_size_bytes is not None else self._default_size()
        if size < MIN_IMAGE_BYTES:
            raise NotEnoughSpace(
                f"workspace pool image would be {size >> 20} MiB, below the "
                f"{MIN_IMAGE_BYTES >> 20} MiB minimum: free space on {self.home}"
            )
        for name in listdir(self.home):
            if name.startswith(f"{_IMAGE_NAME}.tmp-"):
                with contextlib.suppress(FileNotFoundError):
                    (self.home / name).unlink()  # a previous start crashed during mkfs
        tmp = self.home / f"{_IMAGE_NAME}.tmp-{secrets.token_hex(6)}"
        try:
            await asyncio.to_thread(self._allocate, tmp, size)
            await proc.run(
                [mkfs, "-q", "-K", "-m", "reflink=1", "-L", "aenv-ws", str(tmp)],
                timeout=MKFS_TIMEOUT_S,
            )
            tmp.rename(self.image)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        fsync_dirs(self.home)

    def _allocate(self, path: Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            if self.preallocate:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise NotEnoughSpace(f"no room for a {size >> 20} MiB pool image") from exc
                    raise
            else:
                os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def _default_size(self) -> int:
        st = os.statvfs(self.home)
        free = st.f_bavail * st.f_frsize
        size = min(int(free * DEFAULT_IMAGE_FRACTION), DEFAULT_IMAGE_CAP_BYTES)
        return size - size % (1 << 20)
