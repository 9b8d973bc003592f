"""File operations of E2B's volume content API, run by the node on a volume's host directory.

Both the paths (from clients) and the tree (written inside sandboxes: ``link -> /etc``,
``link -> ../../..``, changed while we work) are hostile. So no path is resolved with the host's
view: the root is opened once as an ``O_PATH`` fd and every lookup below it goes through Linux
``openat2(2)`` with ``RESOLVE_IN_ROOT`` (``..`` and symlinks, absolute ones included, resolve as
if chrooted into the root), ``RESOLVE_NO_MAGICLINKS`` and ``RESOLVE_NO_XDEV`` (no mount inside
is crossed); the final component is then handled by ``*at`` calls that do not follow symlinks.

``openat2`` itself is ``storage/openat2.py``. The cleaned path (:func:`clean_path`) is what
comes back in ``EntryStat.path``; errors are from :mod:`aenv.core.errors` (``reason`` set where
the volume API has a code of its own; ``edge/errors.py`` names the others by their status).
Every function closes the fds it opens, except the ones :func:`open_read` and
:func:`open_write` hand out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from stat import S_ISDIR, S_ISLNK, S_ISREG
from typing import Literal

from aenv.core.errors import (
    AenvError,
    Conflict,
    Internal,
    InvalidArgument,
    NotEnoughSpace,
    NotFound,
)
from aenv.storage.openat2 import open_in_root

__all__ = [
    "DEFAULT_ID", "MAX_DEPTH", "EntryStat", "abort_write", "clean_path", "finish_write",
    "list_dir", "make_dir", "open_read", "open_write", "remove", "stat", "update_metadata",
    "write_all",
]

#: Deepest listing a client may ask for.
MAX_DEPTH = 10
#: Owner of what the API creates when the client names none (E2B's default user).
DEFAULT_ID = 9090

_DIR_PATH = os.O_PATH | os.O_DIRECTORY
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_INVALID_ERRNOS = {
    errno.ENOTDIR: "not a directory (or a component of the path is not)",
    errno.EISDIR: "is a directory",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EXDEV: "crosses a mount point",
    errno.ENAMETOOLONG: "name too long",
}

EntryType = Literal["file", "directory", "symlink", "unknown"]


@dataclass(frozen=True)
class EntryStat:
    """One entry as the volume API reports it.

    For a symlink ``type`` and ``mode`` are its target's (resolved inside the volume; a dangling
    or looping link is ``"unknown"`` with mode 0) and ``target`` is the link's text; the other
    fields are the link's own. ``"symlink"`` is therefore never reported as a type.
    """

    name: str
    type: EntryType
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    target: str | None = None


def clean_path(path: str) -> str:
    """``path`` made volume-absolute and normalised; ``..`` cannot climb above ``/``."""
    if not path or "\0" in path:
        raise InvalidArgument("path must be non-empty and must not contain NUL bytes")
    cleaned = posixpath.normpath(path if path.startswith("/") else "/" + path)
    # POSIX lets normpath keep exactly two leading slashes.
    return "/" + cleaned.lstrip("/")


def _mapped(exc: OSError, root: Path, clean: str) -> AenvError:
    err = exc.errno
    if err == errno.ENOENT:
        return NotFound(f"path {clean} not found")
    if err in (errno.EEXIST, errno.ENOTEMPTY):
        return Conflict(f"path {clean} already exists (or changed meanwhile)")
    if err in _SPACE_ERRNOS:
        return NotEnoughSpace(f"volume {root.name} is full: no space left writing {clean}")
    if err in _INVALID_ERRNOS:
        return InvalidArgument(f"{clean}: {_INVALID_ERRNOS[err]}")
    return Internal(f"{clean}: {exc.strerror or exc}")


@contextlib.contextmanager
def _volume(root: Path, path: str) -> Iterator[tuple[int, str]]:
    """The root's fd and the cleaned path; ``OSError`` inside becomes an :class:`AenvError`."""
    clean = clean_path(path)
    try:
        root_fd = os.open(root, _DIR_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise Internal(f"volume root {root} cannot be opened: {exc.strerror}") from exc
    try:
        yield root_fd, clean
    except OSError as exc:
        raise _mapped(exc, root, clean) from exc
    finally:
        os.close(root_fd)


def _kind(mode: int) -> EntryType:
    if S_ISREG(mode):
        return "file"
    if S_ISDIR(mode):
        return "directory"
    return "symlink" if S_ISLNK(mode) else "unknown"


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


def _entry(root_fd: int, dir_fd: int, name: str, clean: str) -> EntryStat:
    """The entry ``name`` of ``dir_fd``, known to clients as ``clean``."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    kind, mode, target = _kind(info.st_mode), info.st_mode & 0o777, None
    if S_ISLNK(info.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        try:
            fd = open_in_root(root_fd, clean, os.O_PATH)
        except OSError:
            kind, mode = "unknown", 0
        else:
            try:
                resolved = os.fstat(fd)
            finally:
                os.close(fd)
            kind, mode = _kind(resolved.st_mode), resolved.st_mode & 0o777
    return EntryStat(
        name=posixpath.basename(clean) or "/", type=kind, path=clean, size=info.st_size,
        mode=mode, uid=info.st_uid, gid=info.st_gid, atime=_time(info.st_atime_ns),
        mtime=_time(info.st_mtime_ns), ctime=_time(info.st_ctime_ns), target=target,
    )


def _parent(root_fd: int, clean: str) -> tuple[int, str]:
    """An fd of the directory holding ``clean`` (the caller closes it) and the entry's name."""
    if clean == "/":
        return open_in_root(root_fd, "/", _DIR_PATH), "."
    return open_in_root(root_fd, posixpath.dirname(clean), _DIR_PATH), posixpath.basename(clean)


def _make_one(dir_fd: int, name: str, uid: int, gid: int, mode: int) -> int:
    """Creates directory ``name`` in ``dir_fd``, owned and moded exactly (no umask); its fd."""
    # 0700 until chown and chmod are done, so nobody else gets in meanwhile.
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fd = open_in_root(dir_fd, name, _DIR_READ | os.O_NOFOLLOW)
    try:
        # chown before chmod: chown clears set-id bits, even root's.
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode & 0o7777)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ensure_dirs(root_fd: int, clean: str, uid: int, gid: int) -> int:
    """An fd of directory ``clean``, creating each missing one (0777, ``uid``:``gid``)."""
    fd = open_in_root(root_fd, "/", _DIR_PATH)
    try:
        parts = [part for part in clean.split("/") if part]
        for i, part in enumerate(parts):
            # Each prefix is resolved from the root, not from the previous fd, so a symlink on the
            # way resolves like it would in a chroot (".." and absolute targets from the root).
            try:
                following = open_in_root(root_fd, "/" + "/".join(parts[: i + 1]), _DIR_PATH)
            except FileNotFoundError:
                following = _make_one(fd, part, uid, gid, 0o777)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular(root_fd: int, clean: str, flags: int) -> int:
    """``clean`` opened with ``flags`` if it is a regular file (following symlinks in the root)."""
    probe = open_in_root(root_fd, clean, os.O_PATH)
    try:
        info = os.fstat(probe)
        if S_ISDIR(info.st_mode):
            raise InvalidArgument(f"{clean} is a directory")
        if not S_ISREG(info.st_mode):
            raise InvalidArgument(f"{clean} is not a regular file")
        # Reopened through the checked fd, not the path: it is the same inode whatever the
        # sandbox does meanwhile, so a FIFO (open blocks) or a device node is never opened.
        return os.open(f"/proc/self/fd/{probe}", flags | os.O_CLOEXEC)
    finally:
        os.close(probe)


def stat(root: Path, path: str) -> EntryStat:
    """The entry at ``path`` itself (a symlink is not followed, see :class:`EntryStat`)."""
    with _volume(root, path) as (root_fd, clean):
        dir_fd, name = _parent(root_fd, clean)
        try:
            return _entry(root_fd, dir_fd, name, clean)
        finally:
            os.close(dir_fd)


def list_dir(root: Path, path: str, depth: int | None = None) -> list[EntryStat]:
    """Entries below directory ``path`` (itself excluded), ``depth`` levels deep (None or < 1:
    one), sorted by name, each directory followed by its subtree. Symlinks are not descended."""
    levels = 1 if depth is None or depth < 1 else depth
    if levels > MAX_DEPTH:
        raise InvalidArgument(f"depth must be between 1 and {MAX_DEPTH}",
                              reason="DEPTH_OUT_OF_RANGE")
    with _volume(root, path) as (root_fd, clean):
        fd = open_in_root(root_fd, clean, _DIR_READ)
        try:
            found: list[EntryStat] = []
            _walk(root_fd, fd, clean, levels, found)
            return found
        finally:
            os.close(fd)


def _walk(root_fd: int, dir_fd: int, dir_path: str, levels: int, found: list[EntryStat]) -> None:
    for name in sorted(os.listdir(dir_fd)):
        child = posixpath.join(dir_path, name)
        try:
            entry = _entry(root_fd, dir_fd, name, child)
        except FileNotFoundError:
            continue  # removed by the sandbox while we list
        found.append(entry)
        if levels > 1 and entry.target is None and entry.type == "directory":
            try:
                sub = open_in_root(dir_fd, name, _DIR_READ | os.O_NOFOLLOW)
            except OSError as exc:
                # Gone or swapped for a link meanwhile, or a mount point: not descended.
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
                    continue
                raise
            try:
                _walk(root_fd, sub, child, levels - 1, found)
            finally:
                os.close(sub)


def make_dir(
    root: Path, path: str, *, uid: int = DEFAULT_ID, gid: int = DEFAULT_ID, mode: int = 0o777,
    force: bool = False,
) -> EntryStat:
    """Creates directory ``path``. Without ``force`` it must not exist and its parent must;
    with ``force`` missing parents are created and an existing directory is returned as is."""
    with _volume(root, path) as (root_fd, clean):
        if clean == "/":
            if not force:
                raise Conflict("path / already exists")
            return _entry(root_fd, root_fd, ".", clean)
        parent = posixpath.dirname(clean)
        name = posixpath.basename(clean)
        dir_fd = (_ensure_dirs(root_fd, parent, uid, gid) if force
                  else open_in_root(root_fd, parent, _DIR_PATH))
        try:
            try:
                os.close(_make_one(dir_fd, name, uid, gid, mode))
            except FileExistsError:
                if not force:
                    raise
                try:
                    os.close(open_in_root(root_fd, clean, _DIR_PATH))
                except OSError as exc:
                    raise Conflict(f"path {clean} exists and is not a directory") from exc
            return _entry(root_fd, dir_fd, name, clean)
        finally:
            os.close(dir_fd)


def open_read(root: Path, path: str) -> tuple[int, int]:
    """An fd open for reading regular file ``path`` (symlinks followed inside the volume) and
    its size. The caller owns the fd: pass it to :func:`read_chunks` or close it."""
    with _volume(root, path) as (root_fd, clean):
        fd = _open_regular(root_fd, clean, os.O_RDONLY)
        try:
            return fd, os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise




def open_write(
    root: Path, path: str, *, force: bool = False, uid: int = DEFAULT_ID, gid: int = DEFAULT_ID,
    mode: int = 0o666,
) -> int:
    """An fd to write file ``path``, already owned ``uid``:``gid`` with ``mode``.

    Without ``force`` the file must not exist (symlinks included) and its parent must; with
    ``force`` missing parents are created like :func:`make_dir` and an existing regular file
    (reached through symlinks inside the volume) is truncated. Stream with :func:`write_all`,
    then :func:`finish_write`; on giving up (client gone) call :func:`abort_write`.
    """
    with _volume(root, path) as (root_fd, clean):
        if clean == "/":
            raise InvalidArgument("/ is a directory")
        if force:
            os.close(_ensure_dirs(root_fd, posixpath.dirname(clean), uid, gid))
        try:
            # O_EXCL never follows a final symlink: a fresh regular file, nothing else.
            fd = open_in_root(root_fd, clean, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not force:
                raise
            fd = _open_regular(root_fd, clean, os.O_WRONLY | os.O_TRUNC)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode & 0o7777)
        except BaseException:
            abort_write(root, fd, clean)
            raise
        return fd


@contextlib.contextmanager
def _aborting(root: Path, fd: int, path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        abort_write(root, fd, path)
        raise _mapped(exc, root, clean_path(path)) from exc
    except BaseException:
        abort_write(root, fd, path)
        raise


def write_all(root: Path, fd: int, path: str, data: bytes) -> None:
    """Writes all of ``data`` to ``fd`` from :func:`open_write`. On failure (a full volume is
    :class:`NotEnoughSpace`) the partial file is removed and ``fd`` closed before raising."""
    with _aborting(root, fd, path):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def finish_write(root: Path, fd: int, path: str) -> EntryStat:
    """Makes the written file durable, closes ``fd`` and returns the entry at ``path``."""
    with _aborting(root, fd, path):
        os.fsync(fd)  # ext4's delayed allocation may only report a full volume here
    os.close(fd)
    return stat(root, path)


def abort_write(root: Path, fd: int, path: str) -> None:
    """Drops a write in progress: frees its blocks, removes the file if ``path`` still names it,
    and closes ``fd``. Best effort: never raises."""
    try:
        with contextlib.suppress(OSError, AenvError):
            written = os.fstat(fd)
            os.ftruncate(fd, 0)  # frees the space even when the name is no longer ours to unlink
            with _volume(root, path) as (root_fd, clean):
                dir_fd, name = _parent(root_fd, clean)
                try:
                    there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if (there.st_dev, there.st_ino) == (written.st_dev, written.st_ino):
                        os.unlink(name, dir_fd=dir_fd)
                finally:
                    os.close(dir_fd)
    finally:
        os.close(fd)


def update_metadata(
    root: Path, path: str, *, uid: int | None = None, gid: int | None = None,
    mode: int | None = None,
) -> EntryStat:
    """Changes owner and mode of the entry at ``path`` itself, not a symlink's target.

    A symlink's own mode cannot be changed on Linux (and means nothing), so ``mode`` is
    ignored for one; its owner is changed (``lchown``). Owner goes first: a chown clears the
    set-id bits that ``mode`` may set.
    """
    with _volume(root, path) as (root_fd, clean):
        dir_fd, name = _parent(root_fd, clean)
        try:
            if uid is not None or gid is not None:
                os.chown(name, -1 if uid is None else uid, -1 if gid is None else gid,
                         dir_fd=dir_fd, follow_symlinks=False)
            if mode is not None:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not S_ISLNK(info.st_mode):
                    # Never follows: glibc refuses a symlink swapped in meanwhile (ValueError or
                    # NotImplementedError from Python), and then there is nothing to change.
                    with contextlib.suppress(ValueError, NotImplementedError):
                        os.chmod(name, mode & 0o7777, dir_fd=dir_fd, follow_symlinks=False)
            return _entry(root_fd, dir_fd, name, clean)
        finally:
            os.close(dir_fd)


def remove(root: Path, path: str) -> None:
    """Removes ``path`` and everything below it; a symlink is removed, never followed."""
    if clean_path(path) == "/":
        raise InvalidArgument("cannot delete the volume root", reason="CANNOT_DELETE_ROOT")
    with _volume(root, path) as (root_fd, clean):
        dir_fd, name = _parent(root_fd, clean)
        try:
            _remove_tree(dir_fd, name)
        finally:
            os.close(dir_fd)


def _remove_tree(parent_fd: int, name: str) -> None:
    # One fd at a time however deep the tree (a sandbox can nest directories beyond both the
    # recursion and the fd limit): going up reopens "..", used only if it is the directory we
    # came down from.
    try:
        os.unlink(name, dir_fd=parent_fd)
        return
    except IsADirectoryError:
        pass
    fd = open_in_root(parent_fd, name, _DIR_READ | os.O_NOFOLLOW)
    try:
        # Per level: its name in its parent, the names left in it, the parent's identity.
        stack = [(name, os.listdir(fd), _identity(parent_fd))]
        while stack:
            dir_name, names, parent_id = stack[-1]
            if names:
                child = names.pop()
                try:
                    os.unlink(child, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:
                    here = _identity(fd)
                    # O_NOFOLLOW: a directory swapped for a symlink meanwhile is not entered.
                    sub = open_in_root(fd, child, _DIR_READ | os.O_NOFOLLOW)
                    os.close(fd)
                    fd = sub
                    stack.append((child, os.listdir(fd), here))
                continue
            stack.pop()
            if stack:
                up = os.open("..", _DIR_READ | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                if _identity(fd) != parent_id:
                    raise Conflict(f"{dir_name} was moved while being removed")
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(dir_name, dir_fd=fd if stack else parent_fd)
    finally:
        os.close(fd)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino



