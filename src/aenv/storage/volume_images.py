"""Volume disks on this node: one ext4 image per volume, mounted on the host while it is used.

Owns ``<home>/volumes/`` and nothing else::

    volumes/images/<volume_id>.img     the volume's file system: sparse ext4 of its size (the
                                       size *is* the quota: a write past it is ENOSPC)
    volumes/staging/                   images being made or fetched, renamed into place whole
    volumes/mnt/<volume_id>/           where the image is mounted while sandboxes or the
                                       content API use it (sandboxes get a bind of it)
    volumes/ro/<sandbox_id>/<volume_id>/   a read-only bind of that mount for one sandbox
                                       that reads the volume: the host kernel refuses its
                                       writes, whatever its root remounts inside

Why an image and not a directory: the host has no per-directory quota, and an image is one
file to publish to the repository and to fetch on another node (``volume_catalog.py``). The
mount table and ``/sys/block/loop*`` are the truth for what is mounted: every step is
idempotent, so a node that died mid-way mounts or unmounts again at its next use.

Callers serialize operations on one volume (``orchestrator/volumes.py`` holds a lock per id).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, Conflict, InvalidArgument, NotEnoughSpace
from aenv.envd.volume_binds import ROOT_MODE
from aenv.storage import loopdev
from aenv.storage.ext4_resize import fsync_file
from aenv.storage.files import fsync_dirs
from aenv.storage.mounts import MOUNT_TIMEOUT_S, read_mountinfo, unmount

#: The smallest volume mkfs.ext4 makes with room for files (journal and metadata take a few MiB).
MIN_SIZE_BYTES = 16 << 20
MKFS_TIMEOUT_S = 60.0
#: ``-m 0``: every block is the users'; ``-E root_owner``: the mount root is root's, and made
#: writable by anyone below (sandbox users are arbitrary uids, as at E2B where the content
#: API's files default to 9090).
_MKFS_ARGS = ("-q", "-F", "-m", "0", "-b", "4096", "-L", "aenv-vol", "-E", "root_owner=0:0")
_MOUNT_OPTIONS = "noatime,discard"
#: How long an unmounted volume's loop device may take to go.
_RELEASE_S = 10.0


class VolumeImages:
    def __init__(self, home: Path) -> None:
        self.root = home / "volumes"
        self.images = self.root / "images"
        self.staging = self.root / "staging"
        self.mounts = self.root / "mnt"

    def view(self, volume_id: str, sandbox_id: str) -> Path:
        return self.root / "ro" / sandbox_id / volume_id

    async def make_view(self, volume_id: str, sandbox_id: str) -> Path:
        """A read-only bind of the (mounted) volume for ``sandbox_id`` (idempotent)."""
        target = self.view(volume_id, sandbox_id)
        if any(m.mount_point == str(target) for m in read_mountinfo()):
            return target
        target.mkdir(parents=True, exist_ok=True)
        await proc.run(["mount", "--bind", str(self.mount_point(volume_id)), str(target)],
                       timeout=MOUNT_TIMEOUT_S)
        try:
            await proc.run(["mount", "-o", "remount,bind,ro", str(target)],
                           timeout=MOUNT_TIMEOUT_S)
        except BaseException:
            await asyncio.shield(unmount(str(target), lazy=True, what="a volume view"))
            raise
        return target

    async def drop_views(self, sandbox_id: str) -> None:
        """Every read-only bind of ``sandbox_id`` unmounted and removed (idempotent)."""
        directory = self.root / "ro" / sandbox_id
        if not directory.is_dir():
            return
        for view in directory.iterdir():
            # Lazy: a runtime that has not let go yet cannot keep the view (or the volume's
            # release after it) busy for ever.
            await unmount(str(view), lazy=True, what=f"a view of volume {view.name}")
            with contextlib.suppress(OSError):
                view.rmdir()
        with contextlib.suppress(OSError):
            directory.rmdir()

    def image(self, volume_id: str) -> Path:
        return self.images / f"{volume_id}.img"

    def mount_point(self, volume_id: str) -> Path:
        return self.mounts / volume_id

    def has_image(self, volume_id: str) -> bool:
        return self.image(volume_id).is_file()

    def mounted(self, volume_id: str) -> bool:
        target = str(self.mount_point(volume_id))
        return any(m.mount_point == target for m in read_mountinfo())

    def clean_staging(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    async def make(self, volume_id: str, size_bytes: int) -> Path:
        """A blank volume image of ``size_bytes`` (idempotent: an existing one is kept)."""
        final = self.image(volume_id)
        if final.is_file():
            return final
        if size_bytes < MIN_SIZE_BYTES:
            raise InvalidArgument(f"a volume needs at least {MIN_SIZE_BYTES >> 20} MiB")
        mkfs = loopdev.require_tool("mkfs.ext4", "e2fsprogs")
        tmp = self._staged(volume_id)
        try:
            with open(tmp, "xb") as fh:
                fh.truncate(size_bytes)
            await proc.run([mkfs, *_MKFS_ARGS, str(tmp)], timeout=MKFS_TIMEOUT_S)
            # A new volume is empty, as E2B's: no ``lost+found`` (e2fsck makes it when needed).
            await proc.run([loopdev.require_tool("debugfs", "e2fsprogs"), "-w", "-R",
                            "rmdir lost+found", str(tmp)], timeout=MKFS_TIMEOUT_S)
            await asyncio.to_thread(fsync_file, tmp)
            self.place(tmp, volume_id)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            if isinstance(exc, CommandError) and "No space" in exc.stderr:
                raise NotEnoughSpace(f"no room on this node for volume {volume_id}") from exc
            raise
        return final

    def staged_path(self, volume_id: str) -> Path:
        """Where a fetched image is written before :meth:`place` puts it in."""
        return self._staged(volume_id)

    def place(self, staged: Path, volume_id: str) -> None:
        self.images.mkdir(parents=True, exist_ok=True)
        staged.replace(self.image(volume_id))
        fsync_dirs(self.images)

    async def mount(self, volume_id: str) -> Path:
        """Mount the volume's image at its mount point (idempotent); the mount point."""
        target = self.mount_point(volume_id)
        image = self.image(volume_id)
        if self.mounted(volume_id):
            return target
        sources = {m.source for m in read_mountinfo()}
        for loop in loopdev.loops_backed_by(image):
            if loop.device in sources:
                raise Conflict(f"the image of volume {volume_id} is mounted elsewhere")
        await loopdev.detach_left(image)
        target.mkdir(parents=True, exist_ok=True)
        device = await loopdev.attach(image, direct_io=True)
        try:
            await proc.run(["mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, device, str(target)],
                           timeout=MOUNT_TIMEOUT_S)
        except BaseException:
            await asyncio.shield(loopdev.detach(device))
            raise
        await loopdev.release(device)
        target.chmod(ROOT_MODE)
        return target

    async def unmount(self, volume_id: str) -> None:
        """Unmount it and free its loop device (idempotent); ``Conflict`` while it is busy."""
        target = self.mount_point(volume_id)
        if self.mounted(volume_id):
            await unmount(str(target), lazy=False, what=f"volume {volume_id}")
        image = self.image(volume_id)
        await loopdev.detach_left(image)
        # An autoclear device goes at its last close, which can come just after umount.
        if left := await loopdev.wait_released(image, _RELEASE_S):
            names = ", ".join(loop.device for loop in left)
            raise Conflict(f"volume {volume_id}'s image is still attached to {names}")
        with contextlib.suppress(FileNotFoundError, OSError):
            target.rmdir()

    async def remove(self, volume_id: str) -> None:
        await self.unmount(volume_id)
        with contextlib.suppress(FileNotFoundError):
            self.image(volume_id).unlink()

    def _staged(self, volume_id: str) -> Path:
        self.staging.mkdir(parents=True, exist_ok=True)
        return self.staging / f"{volume_id}.{os.urandom(6).hex()}"

