"""Per-sandbox root filesystems: an overlayfs mount of shared read-only layers plus one upper.

Owns, for each sandbox, these entries of ``<home>/sandboxes/<id>/`` and nothing else there (the
runtime keeps its bundle and logs next to them)::

    upper/        the sandbox's writable delta (survives unmounts: pause, host reboot)
    work/         overlayfs' scratch directory (same filesystem as upper/)
    rootfs/       the merged view, the directory handed to the runtime as the sandbox's "/"
    rootfs.json   which lowers the upper was created over (absolute paths, lowest first)

The lowers (layer directories, normally from :class:`aenv.storage.layers.LayerStore`) are shared
by every sandbox and never written: the kernel writes only to upper/ and work/. Which lowers an
overlay can stack, and the mount itself, are :mod:`aenv.storage.overlay`'s.

The mount table (``/proc/self/mountinfo``) is the truth for what is mounted, ``rootfs.json`` for
what an upper belongs to; both survive a server restart, so recovery is :meth:`list_mounted`
plus :meth:`ensure_mounted`. Callers serialize operations on one sandbox (the orchestrator does,
through its compare-and-set state machine); nothing here is global state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aenv.core.errors import Conflict, InvalidArgument, NotFound
from aenv.storage.exchange import exchange
from aenv.storage.mounts import read_mountinfo, unmount
from aenv.storage.overlay import check_lowers, mount_overlay
from aenv.storage.user_dirs import prepare_user_dirs

if TYPE_CHECKING:
    from aenv.storage.workspaces import WorkspaceStore

log = logging.getLogger("aenv.storage.rootfs")

#: Sandbox ids become path components: letters, digits, ``_.-``, not starting with a dot.
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: Stacked mounts on one mount point can only come from a bug or an outside actor; we peel off
#: at most this many before giving up, so a misbehaving mount table cannot loop us forever.
_MAX_STACKED = 8


def check_sandbox_id(sandbox_id: str) -> str:
    """Return ``sandbox_id`` if it is safe as a path component, else raise InvalidArgument."""
    if not _SANDBOX_ID.match(sandbox_id):
        raise InvalidArgument(f"invalid sandbox id {sandbox_id!r}")
    return sandbox_id


@dataclass(frozen=True)
class SandboxPaths:
    """Where one sandbox's filesystem pieces live on the host."""

    dir: Path
    upper: Path
    work: Path
    rootfs: Path
    record: Path


@dataclass(frozen=True)
class MountedRootfs:
    """A sandbox rootfs found mounted in the mount table."""

    sandbox_id: str
    rootfs: Path
    mount_id: int
    #: ``lowerdir`` as the kernel shows it: top first, relative to the lowers' common parent.
    lowerdir: tuple[str, ...]
    upperdir: str | None


class RootfsStore:
    """The overlay root filesystems of one aenv home (``<home>/sandboxes``)."""

    def __init__(self, sandboxes_dir: Path, workspaces: WorkspaceStore | None = None,
                 disk_mb: int = 10_240) -> None:
        # The kernel reports mount points by their real path; resolve symlinks once so that
        # what we compute and what mountinfo shows compare equal.
        self.root = Path(os.path.realpath(sandboxes_dir))
        #: Disk workspaces (``workspace = "disk"``): each sandbox's upper lives in a disk image
        #: of its own, attached while the rootfs is mounted. None: uppers are plain directories.
        self.workspaces = workspaces
        #: Size of a new sandbox's disk image when the caller gives none.
        self.disk_mb = disk_mb
        #: Rootfs directories ``adopt`` swapped out, being unmounted and deleted.
        self._dropping: set[asyncio.Task[None]] = set()

    @classmethod
    def at_home(cls, home: Path) -> RootfsStore:
        """The rootfs store of the aenv home ``home`` (``<home>/sandboxes``)."""
        return cls(Path(home) / "sandboxes")

    def paths(self, sandbox_id: str) -> SandboxPaths:
        """The host paths of sandbox ``sandbox_id`` (whether or not they exist)."""
        base = self.root / check_sandbox_id(sandbox_id)
        writable = (base if self.workspaces is None
                    else self.workspaces.mount_point(sandbox_id))
        return SandboxPaths(
            dir=base,
            upper=writable / "upper",
            work=writable / "work",
            rootfs=base / "rootfs",
            record=base / "rootfs.json",
        )

    def upper(self, sandbox_id: str) -> Path:
        """The sandbox's upper directory (whether or not it exists)."""
        return self.paths(sandbox_id).upper

    # -- observing ----------------------------------------------------------------------------

    def is_mounted(self, sandbox_id: str) -> bool:
        """Whether the sandbox's rootfs is mounted (in this mount namespace).

        Prerequisites: none. On success: ``True`` iff something is mounted on its rootfs/.
        On failure: :class:`InvalidArgument` for a malformed id.
        """
        target = str(self.paths(sandbox_id).rootfs)
        return any(m.mount_point == target for m in read_mountinfo())

    def list_mounted(self) -> list[MountedRootfs]:
        """Every sandbox rootfs of this home found in the mount table (for recovery).

        Prerequisites: none.
        On success: one entry per overlay mounted on ``<root>/<id>/rootfs``, in mount order.
        On failure: ``OSError`` if the mount table cannot be read.
        """
        found: list[MountedRootfs] = []
        prefix = str(self.root) + "/"
        for m in read_mountinfo():
            if m.fstype != "overlay" or not m.mount_point.startswith(prefix):
                continue
            rest = m.mount_point[len(prefix) :]
            sandbox_id, _, leaf = rest.partition("/")
            if leaf != "rootfs" or not _SANDBOX_ID.match(sandbox_id):
                continue
            lowerdir = m.super_options.get("lowerdir", "")
            found.append(
                MountedRootfs(
                    sandbox_id=sandbox_id,
                    rootfs=Path(m.mount_point),
                    mount_id=m.mount_id,
                    lowerdir=tuple(x for x in lowerdir.split(":") if x),
                    upperdir=m.super_options.get("upperdir"),
                )
            )
        return found

    def recorded_lowers(self, sandbox_id: str) -> list[Path] | None:
        """The lowers the sandbox's upper was created over (lowest first), or ``None`` if unknown.

        Prerequisites: none. On success: the list from ``rootfs.json``.
        On failure: :class:`InvalidArgument` for a malformed id.
        """
        try:
            data = json.loads(self.paths(sandbox_id).record.read_text())
            return [Path(p) for p in data["lowers"]]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def sandbox_ids(self) -> list[str]:
        """Ids of the sandboxes of this home that have a rootfs record (mounted or not).

        With :meth:`list_mounted` this is the "observe" half of recovery: a recorded sandbox
        that is not mounted is paused, or was running before a reboot.

        Prerequisites: none. On success: sorted ids.
        On failure: ``OSError`` if the sandboxes directory cannot be read.
        """
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(
            n for n in names if _SANDBOX_ID.match(n) and (self.root / n / "rootfs.json").exists()
        )

    def layers_referenced(self) -> set[Path]:
        """Every lower directory some sandbox of this home was assembled over.

        Mounted or not: a paused sandbox's upper still needs its lowers to be resumed, so the
        layer cache's GC must keep all of these.

        Prerequisites: none. On success: the set of absolute lower paths.
        On failure: ``OSError`` if the sandboxes directory cannot be read.
        """
        used: set[Path] = set()
        for sandbox_id in self.sandbox_ids():
            used.update(self.recorded_lowers(sandbox_id) or [])
        return used

    # -- changing -----------------------------------------------------------------------------

    async def assemble(self, sandbox_id: str, lowers: Sequence[Path], *,
                       disk_mb: int | None = None, seed: Path | None = None) -> Path:
        """Mount the sandbox's rootfs: ``lowers`` stacked under its upper.

        ``lowers`` go lowest first, as OCI manifests and templates list layers: the base image,
        then each layer on top of it (overlayfs' ``lowerdir=`` wants the reverse; we flip it).

        Prerequisites: every lower is an existing directory without ``:``, ``,``, ``\\`` or
        whitespace in its path; at most :data:`~aenv.storage.overlay.MAX_LOWERS` and short
        enough to fit one page of mount options (compact longer chains); we are root; no other
        operation on this sandbox runs.
        On success: the merged directory ``<root>/<id>/rootfs`` is mounted and returned. An
        existing upper is reused (so unmount + assemble keeps the sandbox's files). Idempotent:
        if the rootfs is already mounted over the same lowers, it is returned as is. A fresh
        upper gets /tmp (1777) and the user's home (/home/user, owned by ``user``) if the layers
        lack them, so the sandbox's unprivileged user can write both.
        Disk workspaces: a fresh sandbox's disk image is made (``disk_mb``, or a clone of the
        image file ``seed``) and attached; an existing one is attached.
        On failure: :class:`InvalidArgument` for bad ids or lowers; :class:`NotFound` if a lower
        is missing; :class:`Conflict` if the rootfs is mounted over, or the upper was created
        over, other lowers; :class:`aenv.core.errors.CommandError` if ``mount`` fails (a fresh
        upper is then removed again, an existing one is kept).
        """
        paths = self.paths(sandbox_id)
        wanted = check_lowers(lowers)
        recorded = self.recorded_lowers(sandbox_id)
        if self.is_mounted(sandbox_id):
            if recorded != wanted:
                raise Conflict(
                    f"rootfs of sandbox {sandbox_id} is mounted over other layers: "
                    f"{_show(recorded)} (asked for {_show(wanted)})"
                )
            return paths.rootfs
        if self.workspaces is not None:
            # The upper is inside the sandbox's disk image: make it (fresh) and attach it.
            fresh = not self.workspaces.image_path(sandbox_id).exists()
            if fresh and seed is not None:
                await self.workspaces.create_from(sandbox_id, seed)
            elif fresh:
                await self.workspaces.create(sandbox_id, disk_mb or self.disk_mb)
            try:
                await self.workspaces.attach(sandbox_id)
            except BaseException:
                if fresh:
                    await asyncio.shield(self.workspaces.remove(sandbox_id))
                raise
        else:
            fresh = not paths.upper.exists()
        if not fresh and recorded is not None and recorded != wanted:
            raise Conflict(
                f"upper of sandbox {sandbox_id} belongs to other layers: {_show(recorded)} "
                f"(asked for {_show(wanted)})"
            )
        # In a thread: the record's fsync would stall the event loop (tens of ms when a fork
        # assembles 16 roots at once).
        record = fresh or recorded is None
        await asyncio.to_thread(self._prepare, paths, wanted, write_record=record)
        try:
            await mount_overlay(wanted, paths.upper, paths.work, paths.rootfs)
            if fresh:
                await asyncio.to_thread(prepare_user_dirs, paths.rootfs)
        except BaseException:
            # Leave no half-made sandbox behind; an upper that existed before holds the
            # sandbox's files and is never removed here.
            if fresh:
                await asyncio.shield(self._undo_fresh(paths))
            raise
        return paths.rootfs

    def _prepare(self, paths: SandboxPaths, lowers: list[Path], *, write_record: bool) -> None:
        _make_dir(self.root, 0o755)
        _make_dir(paths.dir, 0o700)  # host-side privacy: only root walks into a sandbox's files
        _make_dir(paths.upper, 0o755)  # the upper's root inode is the merged "/" of the sandbox
        _make_dir(paths.work, 0o700)
        _make_dir(paths.rootfs, 0o755)
        if write_record:
            _write_record(paths.record, lowers)

    async def _undo_fresh(self, paths: SandboxPaths) -> None:
        if any(m.mount_point == str(paths.rootfs) for m in read_mountinfo()):
            await unmount(str(paths.rootfs), lazy=True, what="a half-assembled rootfs")
        if self.workspaces is not None:
            await self.workspaces.remove(paths.dir.name)
        await asyncio.to_thread(_remove_pieces, paths)

    async def ensure_mounted(self, sandbox_id: str) -> Path:
        """Re-mount an existing sandbox rootfs (after a host reboot or server restart).

        Prerequisites: the sandbox was assembled before and its upper and ``rootfs.json`` still
        exist; the recorded lowers still exist; no other operation on this sandbox runs.
        On success: the rootfs is mounted over the recorded lowers and returned; a no-op if it
        already was.
        On failure: :class:`NotFound` if the upper, its record or a lower is gone (the
        sandbox's files cannot be recovered here); :class:`aenv.core.errors.CommandError` if
        ``mount`` fails.
        """
        paths = self.paths(sandbox_id)
        if self.is_mounted(sandbox_id):
            return paths.rootfs
        recorded = self.recorded_lowers(sandbox_id)
        if self.workspaces is not None and self.workspaces.image_path(sandbox_id).exists():
            await self.workspaces.attach(sandbox_id)
        if recorded is None or not paths.upper.is_dir():
            raise NotFound(f"sandbox {sandbox_id} has no upper layer to mount in {paths.dir}")
        lowers = check_lowers(recorded)
        _make_dir(paths.work, 0o700)
        _make_dir(paths.rootfs, 0o755)
        await mount_overlay(lowers, paths.upper, paths.work, paths.rootfs)
        return paths.rootfs

    async def adopt(self, sandbox_id: str, donor_id: str) -> Path:
        """Give sandbox ``sandbox_id`` the mounted rootfs of ``donor_id``: a sandbox assembled
        over the same lowers ahead of need (a pre-created one). The two directories
        ``<root>/<id>`` swap in one step (``exchange``), so at every instant ``sandbox_id``
        has one whole rootfs; what was ``sandbox_id``'s (mounted or not) then has the donor's
        name and is unmounted and deleted in the background, off the caller's path (a crash
        first leaves it as a stray rootfs, which recovery removes).

        Prerequisites: memory workspaces (a disk workspace is the sandbox's own files, and
        the donor's would be another's); the donor is mounted over the lowers recorded for
        ``sandbox_id``; nothing runs in ``sandbox_id`` and its upper holds nothing but
        what ``assemble`` made in the donor's (its root's writes were kept in its memory); no
        other operation on either runs.
        On success: ``sandbox_id``'s rootfs (mounted) is returned; nothing of ``donor_id``
        is left here.
        On failure: :class:`Conflict` when the prerequisites do not hold (nothing changed).
        """
        if self.workspaces is not None:
            raise Conflict("a sandbox with a disk workspace cannot take another's rootfs")
        mine, donor = self.paths(sandbox_id), self.paths(donor_id)
        if not self.is_mounted(donor_id):
            raise Conflict(f"the rootfs of {donor_id} is not mounted")
        lowers = self.recorded_lowers(sandbox_id)
        if lowers is not None and lowers != self.recorded_lowers(donor_id):
            raise Conflict(f"sandbox {sandbox_id} and {donor_id} have other layers")
        if not await asyncio.to_thread(_nothing_beyond, mine.upper, donor.upper):
            raise Conflict(f"sandbox {sandbox_id} has files of its own in {mine.upper}")
        if await asyncio.to_thread(self._swap, mine, donor):
            # ``donor_id`` names what was the sandbox's: no files of its own (checked above).
            task = asyncio.create_task(self._drop_swapped(donor_id))
            self._dropping.add(task)
            task.add_done_callback(self._dropping.discard)
        return mine.rootfs

    def _swap(self, mine: SandboxPaths, donor: SandboxPaths) -> bool:
        """Whether ``donor.dir`` holds what was ``mine.dir`` afterwards."""
        if not mine.dir.exists():
            donor.dir.rename(mine.dir)
            return False
        try:
            exchange(mine.dir, donor.dir)
        except OSError as exc:
            raise Conflict(f"cannot swap {mine.dir} and {donor.dir}: {exc}") from exc
        return True

    async def _drop_swapped(self, name: str) -> None:
        try:
            await self.disassemble(name, keep_upper=False, lazy=True)
        except Exception as exc:
            log.warning("could not remove the rootfs a sandbox swapped out (%s): %s", name, exc)

    async def disassemble(self, sandbox_id: str, *, keep_upper: bool, lazy: bool = False) -> None:
        """Unmount the sandbox's rootfs and, unless ``keep_upper``, delete its files.

        Prerequisites: nothing runs in the sandbox any more (its runtime is destroyed or
        checkpointed); no other operation on this sandbox runs.
        On success: nothing is mounted on its rootfs/. With ``keep_upper`` the upper and its
        record stay (pause; :meth:`assemble` or :meth:`ensure_mounted` brings the files back);
        otherwise upper/, work/, rootfs/ and rootfs.json are removed, and the sandbox directory
        too if nothing else is left in it. Idempotent: disassembling twice is fine. ``lazy``
        detaches a busy mount (``umount --lazy``) instead of failing; the kernel frees it when
        the last user goes.
        On failure: :class:`Conflict` if the rootfs is busy (without ``lazy``) or something else
        is mounted inside the sandbox directory (nothing is deleted then);
        :class:`aenv.core.errors.CommandError` if ``umount`` fails otherwise.
        """
        paths = self.paths(sandbox_id)
        target = str(paths.rootfs)
        for _ in range(_MAX_STACKED):
            if not self.is_mounted(sandbox_id):
                break
            await unmount(target, lazy=lazy, what=f"rootfs of sandbox {sandbox_id}")
        if self.is_mounted(sandbox_id):
            raise Conflict(f"could not unmount the rootfs of sandbox {sandbox_id}: still mounted")
        if self.workspaces is not None:
            # Detached while paused (its loop device and mount are freed), removed at the end.
            if keep_upper:
                await self.workspaces.detach(sandbox_id)
            else:
                await self.workspaces.remove(sandbox_id)
        if keep_upper:
            return
        # Deleting a tree that has a mount inside it would delete through the mount; as root
        # that could reach anything. Refuse rather than guess.
        inside = str(paths.dir) + "/"
        leftover = [m.mount_point for m in read_mountinfo() if m.mount_point.startswith(inside)]
        if leftover:
            raise Conflict(f"sandbox {sandbox_id} still has mounts inside it: {leftover}")
        await asyncio.to_thread(_remove_pieces, paths)



def _show(lowers: Sequence[Path] | None) -> str:
    return "unknown" if lowers is None else ":".join(str(p) for p in lowers)


def _nothing_beyond(tree: Path, other: Path) -> bool:
    """Whether every entry of ``tree`` (absent counts as empty) is in ``other`` too, of the
    same kind and size: ``tree`` holds nothing of its own."""
    return _entries(tree) <= _entries(other)


def _entries(tree: Path) -> set[tuple[str, int, int]]:
    found = set()
    for root, dirs, files in os.walk(tree):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            found.add((os.path.relpath(os.path.join(root, name), tree), st.st_mode,
                       0 if name in dirs else st.st_size))
    return found


def _make_dir(path: Path, mode: int) -> None:
    try:
        path.mkdir(mode)
    except FileExistsError:
        return
    path.chmod(mode)  # mkdir's mode is filtered by umask; these modes are deliberate


def _write_record(path: Path, lowers: Sequence[Path]) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    data: dict[str, Any] = {"lowers": [str(p) for p in lowers], "created": time.time()}
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def _remove_pieces(paths: SandboxPaths) -> None:
    """Delete a sandbox's upper, work dir, record and (empty) mount point. Blocking."""
    for tree in (paths.upper, paths.work):
        if tree.is_dir() and not tree.is_symlink():
            # What someone else removed meanwhile (a node shutting down) counts as removed.
            shutil.rmtree(tree, onerror=_unless_gone)
    with contextlib.suppress(FileNotFoundError):
        paths.record.unlink()
    # rmdir, never rmtree: if anything were still mounted here, rmdir fails instead of deleting
    # through the mount.
    for directory in (paths.rootfs, paths.dir):
        with contextlib.suppress(FileNotFoundError, OSError):
            directory.rmdir()


def _unless_gone(function: object, path: str, exc_info: tuple[type, BaseException, object]
                 ) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
