"""Sandbox workspaces: one ext4 image of the sandbox's ``diskSizeMB`` per sandbox, in the pool.

Owns these entries of the reflink pool (``<home>/workspaces``, see :mod:`aenv.storage.reflink_fs`)
and ``<home>/workspaces-mnt/`` and nothing else::

    <pool>/<sandbox_id>.img         the sandbox's disk: sparse ext4 of diskSizeMB (writable)
    <pool>/.blank/<size_mb>.img     a blank ext4 per size, made once by mkfs.ext4; every create
                                    is a clone of it (~ms), never an mkfs
    <pool>/.staging/<name>.<hex>    images being made; linked into place when complete
    <home>/workspaces-mnt/<id>/     where the image is mounted while attached, holding
        upper/  work/               the overlayfs upper and work directories of the sandbox's rootfs

Why a filesystem per sandbox (docs/spikes/workspace-gvisor.md, design I): the image size *is* the
quota (a write past it is ENOSPC in the guest, the sandbox lives on), and snapshot/fork copies one
file with ``FICLONE`` whatever the number of files inside. Images appear only by ``link(2)`` of a
complete, fsynced file from ``.staging`` (no clobbering), so a crash never leaves a half image
under a sandbox id; :meth:`WorkspaceStore.clean_staging` sweeps the leftovers.

Attached = loop device + ext4 mount at ``workspaces-mnt/<id>``
(:mod:`aenv.storage.workspace_mounts` does the mounting, freezing and thawing). The mount table
and ``/sys/block/loop*`` are the truth for what is attached; :meth:`observe` reads both for
crash recovery, and every clean-up step counts "already gone" as done. Callers serialize
operations on one sandbox (the orchestrator's state machine does), except that a
publish of a paused sandbox may clone its disk meanwhile: every attach, detach, clone and
resize takes the sandbox's lock.

Space: the pool must never run out underneath a sandbox. Measured: when a sparse image cannot
get blocks from a full pool, the guest's ext4 sees I/O errors, aborts its journal and goes
read-only, losing data. So creates and clones are admitted only while the worst case fits:
every writable image may fill up to its size, every other file (snapshots, blanks) keeps what
it holds; see :func:`aenv.storage.workspace_state.committed_bytes`, which with
:func:`~aenv.storage.workspace_state.observe` holds the read-only side of this module. Nor must
the host's file system under the pool fill up: above its watermark
(:class:`aenv.storage.host_disk.Watermark`) no image is made, cloned or grown, and the blocks
the pool frees go back to the host (:mod:`aenv.storage.pool_trim`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import (
    AlreadyExists,
    CommandError,
    FailedPrecondition,
    InvalidArgument,
    NotEnoughSpace,
    NotFound,
)
from aenv.core.keyed_locks import KeyedLocks
from aenv.storage import ext4_resize, loopdev, workspace_state
from aenv.storage.files import fsync_dirs, listdir
from aenv.storage.host_disk import DiskUsage, Watermark
from aenv.storage.mounts import read_mountinfo
from aenv.storage.pool_trim import PoolTrimmer
from aenv.storage.reflink_fs import NotReflinkable, ReflinkPool, ficlone
from aenv.storage.rootfs import check_sandbox_id
from aenv.storage.workspace_mounts import (
    freeze,
    mount_image,
    mounted_device,
    thaw,
    unmount_image,
)
from aenv.storage.workspace_state import BLANK as _BLANK
from aenv.storage.workspace_state import STAGING as _STAGING
from aenv.storage.workspace_state import SUFFIX as _SUFFIX
from aenv.storage.workspace_state import WorkspaceObservation

#: mkfs.ext4 needs a few MiB for its journal and metadata; E2B's smallest disk is far above.
MIN_SIZE_MB = 32
MAX_SIZE_MB = 16 << 20  # 16 TiB, ext4's limit with 4 KiB blocks
#: mkfs.ext4 of a sparse 5 GiB file takes ~20 ms; a minute means a hung pool.
MKFS_TIMEOUT_S = 60.0
#: ``-m 0``: the whole disk is the guest's (reserved blocks need CAP_SYS_RESOURCE to reach);
#: ``-b 4096``: mke2fs would choose 1 KiB blocks below 512 MiB. On a file, mke2fs zeroes by
#: discard (hole punch), so inode tables are marked zeroed and no lazyinit thread writes later.
_MKFS_EXT4_ARGS = ("-q", "-F", "-m", "0", "-b", "4096", "-L", "aenv-ws")
#: A deleted image's file system may outlive its unmount a moment; a kill waits this long for
#: it only to leave no loop device behind (nothing can attach a deleted image).
_REMOVE_RELEASE_S = 2.0

log = logging.getLogger("aenv.storage.workspaces")


@dataclass(frozen=True)
class Workspace:
    """A workspace image on disk."""

    sandbox_id: str
    image: Path
    size_mb: int


class WorkspaceStore:
    """The per-sandbox disk images of one aenv home, over a started :class:`ReflinkPool`."""

    def __init__(self, pool: ReflinkPool, *, overcommit: float | None = 1.0,
                 reserve_mb: int = 64, host_watermark_percent: float = 100.0,
                 trim_interval_s: float = 5.0):
        self.pool = pool
        #: ``<home>/workspaces-mnt``: mount points of attached workspaces.
        self.mounts_root = pool.home / "workspaces-mnt"
        #: Admit images while the worst case is at most this share of the pool's size (None:
        #: no bound). Above 1 a pool can fill under running sandboxes (their writes then fail
        #: with EIO, see above).
        self.overcommit = overcommit
        #: Room kept free for the pool filesystem's own metadata (XFS log, extent maps).
        self.reserve_bytes = reserve_mb << 20
        #: No new image while the host file system under the pool is fuller than this (%).
        self.host_watermark_percent = host_watermark_percent
        #: Gives freed pool blocks back to the host; the node runs ``trimmer.run()``.
        self.trimmer = PoolTrimmer(pool, interval_s=trim_interval_s)
        self._admit = asyncio.Lock()
        #: One attach, detach, clone or resize of a sandbox's workspace at a time: a publish
        #: of a paused sandbox clones its disk while a kill or resume may detach or attach it.
        self._ops = KeyedLocks()
        #: Bytes of clones admitted and not yet linked (the space check counts them).
        self._pending_bytes = 0
        self._blank_locks: collections.defaultdict[int, asyncio.Lock] = collections.defaultdict(
            asyncio.Lock
        )

    # -- paths and reading --------------------------------------------------------------------

    def image_path(self, sandbox_id: str) -> Path:
        """Where sandbox ``sandbox_id``'s image lives (whether or not it exists)."""
        return self.pool.path / f"{check_sandbox_id(sandbox_id)}{_SUFFIX}"

    def mount_point(self, sandbox_id: str) -> Path:
        """Where the image is mounted while attached; ``upper/`` and ``work/`` are inside."""
        return self.mounts_root / check_sandbox_id(sandbox_id)

    def get(self, sandbox_id: str) -> Workspace:
        """The workspace of ``sandbox_id``; :class:`NotFound` if it has none."""
        image = self.image_path(sandbox_id)
        try:
            size = image.stat().st_size
        except FileNotFoundError:
            raise NotFound(f"sandbox {sandbox_id} has no workspace image") from None
        return Workspace(sandbox_id, image, size >> 20)

    def is_attached(self, sandbox_id: str) -> bool:
        """Whether the workspace is mounted at its mount point."""
        return mounted_device(self.mount_point(sandbox_id)) is not None

    def committed_bytes(self) -> int:
        """The most the pool's files can ever occupy (:func:`workspace_state.committed_bytes`)."""
        return workspace_state.committed_bytes(self.pool.path)

    def observe(self) -> WorkspaceObservation:
        """Every workspace image, loop device and mount of this store (no subprocess)."""
        return workspace_state.observe(self.pool.path, self.mounts_root)

    def host_watermark(self) -> Watermark:
        """The watermark of the host file system the pool's blocks come from."""
        return Watermark(self.pool.host_path(), self.host_watermark_percent)

    async def ensure_host_room(self, what: str) -> DiskUsage:
        """Refuse ``what`` (e.g. "a new sandbox", "resuming sandbox X") before it takes disk.

        Prerequisites: the pool is started. On success: the host file system's usage, at or
        below the watermark. On failure: :class:`aenv.storage.host_disk.HostDiskFull` (429
        with ``Retry-After``) naming the usage and the watermark; nothing was touched.
        """
        return await self.host_watermark().ensure_below(what)

    # -- creating and copying -----------------------------------------------------------------

    async def create(self, sandbox_id: str, size_mb: int) -> Workspace:
        """Give ``sandbox_id`` a new, empty workspace of ``size_mb`` MiB.

        Prerequisites: the pool is started; the sandbox has no workspace.
        On success: ``<pool>/<id>.img``, a clone of the blank ext4 of that size (made by mkfs
        the first time a size is asked for), not attached.
        On failure: :class:`AlreadyExists`; :class:`InvalidArgument` for a size out of
        [MIN_SIZE_MB, MAX_SIZE_MB]; :class:`NotEnoughSpace` if the worst case would not fit the
        pool; :class:`FailedPrecondition` if mkfs.ext4 is missing. No image is left behind.
        """
        if not MIN_SIZE_MB <= size_mb <= MAX_SIZE_MB:
            raise InvalidArgument(f"disk size {size_mb} MiB not in [{MIN_SIZE_MB}, {MAX_SIZE_MB}]")
        image = self.image_path(sandbox_id)
        if image.exists():
            raise AlreadyExists(f"sandbox {sandbox_id} already has a workspace")
        blank = await self._blank(size_mb)
        await self._clone_into(blank, image, writable=True, copy_ok=True)
        return Workspace(sandbox_id, image, size_mb)

    async def create_from(self, sandbox_id: str, source: Path) -> Workspace:
        """Give ``sandbox_id`` a workspace that is a clone of the image file ``source`` (a
        snapshot's, made by :meth:`clone` or :meth:`clone_frozen`).

        Prerequisites: ``source`` is on the pool's filesystem and nothing writes it.
        On success: ``<pool>/<id>.img`` with ``source``'s content, not attached.
        On failure: :class:`AlreadyExists`, :class:`NotFound` (no ``source``),
        :class:`NotEnoughSpace`, :class:`NotReflinkable`; no image is left behind.
        """
        image = self.image_path(sandbox_id)
        if image.exists():
            raise AlreadyExists(f"sandbox {sandbox_id} already has a workspace")
        if not source.is_file():
            raise NotFound(f"workspace image {source} not found")
        await self._clone_into(source, image, writable=True)
        return self.get(sandbox_id)

    async def clone(self, src_id: str, dest: str | Path) -> Path:
        """Copy ``src_id``'s detached workspace, sharing every block (``FICLONE``).

        ``dest`` is a sandbox id (a ``str``: a fork child's workspace ``<pool>/<id>.img``) or a
        file path (a ``Path``: e.g. a snapshot's image; on the pool's filesystem, not existing).

        Prerequisites: the source is *not* attached (an attached one may have writes in flight:
        use :meth:`clone_frozen`).
        On success: the path of the new file, complete and durable.
        On failure: :class:`NotFound`; :class:`FailedPrecondition` if the source is attached;
        :class:`NotReflinkable` on a pool without reflinks; :class:`AlreadyExists` if ``dest``
        exists; :class:`NotEnoughSpace`. Nothing is left at ``dest``.
        """
        async with self._ops.hold(src_id):
            return await self._clone_detached(src_id, dest)

    async def _clone_detached(self, src_id: str, dest: str | Path) -> Path:
        source = self.get(src_id).image
        if self.is_attached(src_id) or loopdev.loops_backed_by(source):
            raise FailedPrecondition(
                f"workspace of {src_id} is attached: freeze it (clone_frozen) or detach it first"
            )
        return await self._clone_to(source, dest)

    async def clone_frozen(self, src_id: str, dest: str | Path) -> Path:
        """Point-in-time copy of ``src_id``'s workspace, attached or not: ``fsfreeze -f`` of its
        ext4 (flushes it clean and blocks its writers), ``FICLONE``, ``fsfreeze -u``.

        Prerequisites: as :meth:`clone`, except that the source may be attached. Writers in the
        sandbox block (uninterruptibly) while frozen, so pause the sandbox first; the freeze
        takes as long as writing back what it left dirty (~50-65 ms for 10 MiB in the spike).
        On success: as :meth:`clone`; the filesystem is thawed.
        On failure: as :meth:`clone`; the filesystem is thawed whatever failed (also on
        cancellation). Only a crash of this process can leave it frozen: :meth:`attach` of an
        attached workspace thaws it.
        """
        async with self._ops.hold(src_id):
            source = self.get(src_id).image
            mount_point = self.mount_point(src_id)
            if mounted_device(mount_point) is None:
                return await self._clone_detached(src_id, dest)
            try:
                await freeze(mount_point)
                return await self._clone_to(source, dest)
            finally:
                await asyncio.shield(thaw(mount_point))

    async def grow(self, sandbox_id: str, size_mb: int) -> Workspace:
        """Make ``sandbox_id``'s disk ``size_mb`` MiB.

        Prerequisites: the workspace exists; ``size_mb`` is not below its size (ext4 shrinks
        only offline, and a guest may use every block). Detached, or attached on a host where
        this process has CAP_SYS_RESOURCE (the kernel's online ext4 resize demands it).
        On success: the image file and the ext4 in it have the new size (attached: the guest
        sees it at once). Detached: ``e2fsck -f -p`` then ``resize2fs`` of the file.
        On failure: :class:`InvalidArgument`, :class:`NotEnoughSpace`, :class:`NotFound`;
        :class:`FailedPrecondition` if attached and online resize is not permitted (detach and
        retry); ``CommandError`` from e2fsck/resize2fs. A crash after the file grew and before
        resize2fs leaves a bigger file over the old filesystem: calling grow again finishes it.
        """
        async with self._ops.hold(sandbox_id):
            ws = self.get(sandbox_id)
            if not ws.size_mb <= size_mb <= MAX_SIZE_MB:
                raise InvalidArgument(
                    f"cannot resize {sandbox_id}'s {ws.size_mb} MiB disk to {size_mb}"
                )
            what = f"{sandbox_id}'s disk"
            device = mounted_device(self.mount_point(sandbox_id))
            if device is not None:
                ext4_resize.refuse_online_without_cap(what)
            async with self._admit:
                await asyncio.to_thread(self._check_space, (size_mb - ws.size_mb) << 20, what)
                os.truncate(ws.image, size_mb << 20)
            if device is not None:
                await ext4_resize.grow_online(device, what)
            else:
                await ext4_resize.grow_offline(ws.image)
            return self.get(sandbox_id)

    # -- attaching ----------------------------------------------------------------------------

    async def attach(self, sandbox_id: str) -> Path:
        """Mount ``sandbox_id``'s workspace at :meth:`mount_point` (idempotent).

        Prerequisites: the workspace exists; root.
        On success: the mount point, with ``upper/`` and ``work/`` for the sandbox's overlay.
        Already attached: returned as is, thawed if a crash left it frozen. Loop devices a
        crash left unmounted on the image are detached first.
        On failure: :class:`NotFound`; :class:`Conflict` if something else is mounted there or
        the image is mounted elsewhere; ``CommandError`` if mount fails (the message is
        mount's, e.g. a damaged filesystem). The loop device is detached again on failure.
        """
        async with self._ops.hold(sandbox_id):
            image = self.get(sandbox_id).image
            mount_point = self.mount_point(sandbox_id)
            await mount_image(sandbox_id, image, mount_point)
            return mount_point

    async def detach(self, sandbox_id: str, *, settle: bool = True) -> None:
        """Unmount the workspace and free its loop device (idempotent: not attached = done).

        Prerequisites: nothing uses the mount any more (the sandbox's overlay is unmounted).
        On success: not mounted, mount point directory removed; with ``settle`` also no loop
        device on the image, which means the file system has ended and its data is on the
        image. Without it (the image is deleted next) the device may linger a moment.
        On failure: :class:`Conflict` if the mount is busy, or the file system has not ended
        within :data:`~aenv.storage.workspace_mounts.RELEASE_TIMEOUT_S` (the image is then not
        attached again until it has); ``CommandError`` otherwise.
        """
        async with self._ops.hold(sandbox_id):
            await self._detach(sandbox_id, settle=settle)

    async def _detach(self, sandbox_id: str, *, settle: bool) -> None:
        await unmount_image(sandbox_id, self.image_path(sandbox_id),
                            self.mount_point(sandbox_id), settle=settle)
        # The ext4's last discards (holes in its image) went out at its unmount.
        self.trimmer.request()

    async def remove(self, sandbox_id: str) -> None:
        """Detach and delete the workspace (idempotent: no workspace = done).

        Prerequisites: as :meth:`detach`. On success: the image is gone; clones of it (snapshots,
        fork children) are independent files and keep their data.
        On failure: as :meth:`detach`; the image stays if detaching failed.
        """
        image = self.image_path(sandbox_id)
        async with self._ops.hold(sandbox_id):
            await self._detach(sandbox_id, settle=False)
            with contextlib.suppress(FileNotFoundError):
                image.unlink()
                fsync_dirs(self.pool.path)
        # Nothing can attach a deleted image, so a file system that lives on is harmless here:
        # waited for only so that a kill leaves no device behind, and never failed for.
        left = await loopdev.wait_released(image, _REMOVE_RELEASE_S)
        # A deleted image's blocks are freed at its device's last close, not at the unlink: a
        # trim asked for before that close found them still in use and gave nothing back.
        self.trimmer.request()  # in the background: the kill does not wait for it
        if left:
            log.warning("the deleted workspace of %s is still held by the kernel (%s)",
                        sandbox_id, ", ".join(loop.device for loop in left))

    async def clean_staging(self) -> None:
        """Remove what crashed creates and clones left in ``.staging`` and free loop devices on
        deleted or non-workspace pool files. Call at start-up, before any create or clone."""
        sources = {m.source for m in read_mountinfo()}
        for device in self.observe().orphan_loops:
            if device not in sources:
                await loopdev.detach(device)
        for name in listdir(self.pool.path / _STAGING):
            with contextlib.suppress(FileNotFoundError):
                (self.pool.path / _STAGING / name).unlink()

    # -- inside -------------------------------------------------------------------------------

    async def _blank(self, size_mb: int) -> Path:
        blank = self.pool.path / _BLANK / f"{size_mb}{_SUFFIX}"
        if blank.exists():
            return blank
        async with self._blank_locks[size_mb]:
            if blank.exists():
                return blank
            mkfs = loopdev.require_tool("mkfs.ext4", "e2fsprogs")
            blank.parent.mkdir(exist_ok=True)
            tmp = self._staging_path(f"blank-{size_mb}")
            try:
                with open(tmp, "xb") as fh:
                    fh.truncate(size_mb << 20)
                await proc.run([mkfs, *_MKFS_EXT4_ARGS, str(tmp)], timeout=MKFS_TIMEOUT_S)
                await asyncio.to_thread(ext4_resize.fsync_file, tmp)
                tmp.rename(blank)  # equal content whoever wins: clobbering is harmless
            except BaseException as exc:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                if isinstance(exc, CommandError) and "No space" in exc.stderr:
                    raise NotEnoughSpace(f"no space in the pool for a blank image: {exc}") from exc
                raise
            fsync_dirs(blank.parent)
        return blank

    def _staging_path(self, name: str) -> Path:
        staging = self.pool.path / _STAGING
        staging.mkdir(exist_ok=True)
        return staging / f"{name}.{secrets.token_hex(6)}"

    async def _clone_to(self, source: Path, dest: str | Path) -> Path:
        if isinstance(dest, str):
            target = self.image_path(dest)
            writable = True
        else:
            target = Path(os.path.realpath(dest))
            writable = False
            if target.parent == self.pool.path or _STAGING in target.parts:
                raise InvalidArgument(f"{dest} is a workspace path: pass a sandbox id instead")
            try:
                same_fs = target.parent.stat().st_dev == self.pool.path.stat().st_dev
            except FileNotFoundError:
                raise NotFound(f"directory {target.parent} does not exist") from None
            if not same_fs:
                raise InvalidArgument(f"{dest} is not on the pool's filesystem {self.pool.path}")
        await self._clone_into(source, target, writable=writable)
        return target

    async def _clone_into(
        self, source: Path, target: Path, *, writable: bool, copy_ok: bool = False
    ) -> None:
        """Clone ``source`` to ``target`` via ``.staging``; admitted under the space lock."""
        if not self.pool.state.reflink and not copy_ok:
            raise NotReflinkable(f"workspace pool {self.pool.path} cannot clone images")
        if target.exists():
            raise AlreadyExists(f"{target} already exists")
        # The space check and the reservation under the lock, the clone outside it: the 16
        # children of a fork clone at once instead of one after another (~7 ms each here).
        async with self._admit:
            st = source.stat()
            wanted = st.st_size if writable else st.st_blocks * 512
            await asyncio.to_thread(self._check_space, wanted + self._pending_bytes,
                                    f"a new disk image ({target.name})")
            self._pending_bytes += wanted
        try:
            tmp = self._staging_path(target.name)
            try:
                if self.pool.state.reflink:
                    await asyncio.to_thread(_clone_linked, source, tmp, target)
                else:  # only blanks (copy_ok): a sparse copy of a fresh mkfs is small
                    await proc.run(["cp", "--sparse=always", str(source), str(tmp)])
                    await asyncio.to_thread(_link_durably, tmp, target)
            except FileExistsError:
                raise AlreadyExists(f"{target} already exists") from None
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise InvalidArgument(f"{target} is not on the pool's filesystem") from exc
                raise
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        finally:
            self._pending_bytes -= wanted

    def _check_space(self, new_bytes: int, what: str) -> None:
        """Blocking (statvfs, a walk of the pool's directory): call it in a thread."""
        self.host_watermark().check(what)
        capacity = self.pool.capacity_bytes()
        if self.overcommit is not None:
            limit = int(capacity * self.overcommit) - self.reserve_bytes
            committed = self.committed_bytes()
            if committed + new_bytes > limit:
                raise NotEnoughSpace(
                    f"workspace pool {self.pool.path} is full: {committed >> 20} MiB "
                    f"committed + {new_bytes >> 20} MiB > {limit >> 20} MiB"
                )
        # Thin-provisioned, the pool's real free space is what protects running sandboxes:
        # new ones are refused while a twentieth of it is left for those already running.
        thin = self.overcommit is None or self.overcommit > 1
        headroom = max(self.reserve_bytes, capacity // 20) if thin else self.reserve_bytes
        if self.pool.free_bytes() < headroom:
            raise NotEnoughSpace(
                f"workspace pool {self.pool.path} has {self.pool.free_bytes() >> 20} MiB free, "
                f"less than the {headroom >> 20} MiB kept for its running sandboxes")


def _clone_linked(source: Path, tmp: Path, target: Path) -> None:
    ficlone(source, tmp)
    _link_durably(tmp, target)


def _link_durably(tmp: Path, target: Path) -> None:
    # link(2), unlike rename(2), never replaces a target created meanwhile. The directory's
    # fsync in this thread too: on the event loop it stalled every request for its duration.
    os.link(tmp, target)
    fsync_dirs(target.parent)
