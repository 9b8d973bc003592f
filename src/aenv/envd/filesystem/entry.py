"""Filesystem entries as envd reports and creates them.

Owns three things every filesystem surface (RPC, ``/files``, watchers) shares:

* :func:`entry_info` builds ``EntryInfo`` exactly like E2B's envd (e2b-compat.md §4.3): the
  link's own ``lstat`` for name/size/owner/mtime/permission string, the *target's* type and
  permission bits for a symlink with its resolved absolute path as ``symlink_target``, Go
  ``FileMode.String()`` permissions, ``user.e2b.*`` xattrs as metadata. ``is_symlink`` is never
  set: E2B's envd has no such field, and SDK 2.63 would report ``SYMLINK`` instead of the
  target's type when it is true.
* :func:`ensure_dirs` creates missing parents one by one, each owned by the acting user, and
  :func:`create_or_truncate` opens an upload's destination the way envd's ``processFile`` does.
* :func:`os_failure` names an ``OSError`` with an error from the one tree, so bad input comes
  back as a 4xx / a proper Connect code, never as an internal error.

It must not decide *which* path to touch: callers resolve paths with ``users.resolve_path``.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import posixpath
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from protobuf.wkt import Timestamp

from aenv.core.errors import (
    AenvError,
    AlreadyExists,
    Internal,
    InvalidArgument,
    NotEnoughSpace,
    NotFound,
    PermissionDenied,
)
from aenv.envd.filesystem.metadata_store import store
from aenv.envd.gen import filesystem_pb as pb

#: xattr namespace holding user metadata; the SDK sees keys with it stripped.
METADATA_PREFIX = "user.e2b."

#: Go's ``FileMode.String()`` type letters, in its order, keyed by our own test of ``st_mode``.
_TYPE_LETTERS: tuple[tuple[str, int], ...] = (
    ("d", stat.S_IFDIR),
    ("L", stat.S_IFLNK),
    ("D", -1),  # block and char devices
    ("p", stat.S_IFIFO),
    ("S", stat.S_IFSOCK),
)


def go_mode_string(st_mode: int) -> str:
    """``ls``-style permissions as Go prints ``os.FileMode`` (``Lrwxrwxrwx``, ``dtrwxrwxrwx``)."""
    fmt = stat.S_IFMT(st_mode)
    out = ""
    for letter, kind in _TYPE_LETTERS:
        if (kind == -1 and fmt in (stat.S_IFBLK, stat.S_IFCHR)) or fmt == kind:
            out += letter
    if st_mode & stat.S_ISUID:
        out += "u"
    if st_mode & stat.S_ISGID:
        out += "g"
    if fmt == stat.S_IFCHR:
        out += "c"
    if st_mode & stat.S_ISVTX:
        out += "t"
    out = out or "-"
    for shift, letter in zip(range(8, -1, -1), "rwxrwxrwx", strict=True):
        out += letter if st_mode & (1 << shift) else "-"
    return out


def file_type(st_mode: int) -> pb.FileType:
    if stat.S_ISREG(st_mode):
        return pb.FileType.FILE
    if stat.S_ISDIR(st_mode):
        return pb.FileType.DIRECTORY
    # Sockets, fifos and devices: E2B reports them as unspecified and the SDK drops them.
    return pb.FileType.UNSPECIFIED


def wire_str(text: str) -> str:
    """A name safe for protobuf/JSON: undecodable bytes (surrogate escapes) become U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return text


class NameCache:
    """uid/gid → name lookups, memoised for one listing (``/etc/passwd`` may change later)."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def group(self, gid: int) -> str:
        name = self._groups.get(gid)
        if name is None:
            try:
                name = grp.getgrgid(gid).gr_name
            except KeyError:
                name = str(gid)
            self._groups[gid] = name
        return name


def read_metadata(path: str, real_path: str | None = None) -> dict[str, str]:
    """``user.e2b.*`` xattrs of ``path`` (following symlinks), prefix stripped; ``{}`` if none.

    Where the filesystem has no xattrs (a disk workspace under gVisor), or the file has none
    but came from such a place, the metadata store answers for ``real_path`` (the resolved
    path, computed when not given).
    """
    metadata: dict[str, str] = {}
    try:
        names = os.listxattr(path)
    except OSError as exc:
        # No xattr support, a dangling link, or a file that just vanished.
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        names = []
    for name in names:
        if not name.startswith(METADATA_PREFIX):
            continue
        try:
            value = os.getxattr(path, name)
        except OSError:
            continue
        metadata[wire_str(name[len(METADATA_PREFIX):])] = value.decode("utf-8", "replace")
    if metadata or not store().has_entries():
        return metadata
    try:
        key = real_path or os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):
        return {}
    return store().get(key)


def write_metadata(fd: int, metadata: Mapping[str, str], path: str) -> None:
    """Replace the ``user.e2b.*`` xattrs of an open file (``path``) with ``metadata`` (keys
    lowercased); in the metadata store where the filesystem has no xattrs."""
    wanted = {METADATA_PREFIX + key.lower(): value for key, value in metadata.items()}
    try:
        existing = [name for name in os.listxattr(fd) if name.startswith(METADATA_PREFIX)]
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            _store_metadata(fd, path, {key.lower(): value for key, value in metadata.items()})
            return
        raise os_failure(exc, "reading metadata") from exc
    if not wanted and not existing:
        # Nothing to set here; a file that had metadata in the store loses it (E2B: each
        # upload replaces all of it).
        _store_metadata(fd, path, {})
        return
    try:
        for name in existing:
            if name not in wanted:
                os.removexattr(fd, name)
        for name, value in wanted.items():
            os.setxattr(fd, name, value.encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            # gVisor's gofer lists no xattrs rather than refusing to; only the write says so.
            _store_metadata(fd, path, {key.lower(): value for key, value in metadata.items()})
            return
        if exc.errno in (errno.E2BIG, errno.ERANGE):
            raise InvalidArgument("file metadata is too large") from exc
        raise os_failure(exc, "writing metadata") from exc


def _store_metadata(fd: int, path: str, metadata: dict[str, str]) -> None:
    try:
        # The path of what was opened, even if a name on the way changed since.
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not real.startswith("/") or real.endswith(" (deleted)"):
            raise OSError(errno.ENOENT, "no path")
    except OSError:
        real = os.path.realpath(path)
    try:
        store().put(real, metadata)
    except OSError as exc:
        raise os_failure(exc, "writing metadata") from exc


def metadata_key(path: str) -> str:
    """The store key of ``path`` itself (its directory resolved, a final symlink not), for
    removals and moves, which act on the name rather than what it points to."""
    parent, name = posixpath.split(path)
    try:
        parent = os.path.realpath(parent or "/")
    except (OSError, RuntimeError):
        pass
    return posixpath.join(parent, name) if name else parent


def forget_metadata(key: str) -> None:
    with contextlib.suppress(OSError):
        store().forget_tree(key)


def move_metadata(source_key: str, destination_key: str) -> None:
    with contextlib.suppress(OSError):
        store().move_tree(source_key, destination_key)


def entry_from_stat(
    path: str, st: os.stat_result, names: NameCache, real_path: str | None = None
) -> pb.EntryInfo:
    """``EntryInfo`` for ``path`` whose ``lstat`` is ``st`` (``real_path``: ``path`` with
    every symlink resolved, when the caller knows it)."""
    mode_bits = stat.S_IMODE(st.st_mode) & 0o777
    kind = file_type(st.st_mode)
    target: str | None = None
    if stat.S_ISLNK(st.st_mode):
        # Like Go's EvalSymlinks: the absolute, fully resolved target, or the link itself if
        # it cannot be resolved (dangling or looping).
        try:
            target = os.path.realpath(path, strict=True)
            target_st = os.stat(target)
            kind, mode_bits = file_type(target_st.st_mode), stat.S_IMODE(target_st.st_mode) & 0o777
        except (OSError, RuntimeError):
            target, kind, mode_bits = path, pb.FileType.UNSPECIFIED, 0
    return pb.EntryInfo(
        name=wire_str(posixpath.basename(path) or path),
        type=kind,
        path=wire_str(path),
        size=st.st_size,
        mode=mode_bits,
        permissions=go_mode_string(st.st_mode),
        owner=names.user(st.st_uid),
        group=names.group(st.st_gid),
        modified_time=Timestamp.from_nanos(st.st_mtime_ns),
        symlink_target=wire_str(target) if target is not None else None,
        metadata=read_metadata(path, target if target is not None else real_path),
    )


def entry_info(path: str, names: NameCache | None = None) -> pb.EntryInfo:
    """``EntryInfo`` for an absolute ``path`` (not following a final symlink).

    On failure: :class:`NotFound` when nothing is there.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise os_failure(exc, f"stat {path}") from exc
    return entry_from_stat(path, st, names or NameCache())


def chown_if_root(target: str | int, uid: int, gid: int, *, created: bool = False) -> None:
    """Hand a file (path or open descriptor) to the acting user; only root can give files away.

    What a thread acting as the user just ``created`` is already theirs, but is chowned all the
    same: E2B's envd always chowns, and watchers expect the attribute event that causes.
    """
    euid = os.geteuid()
    if euid != 0 and not (created and euid == uid):
        return
    if isinstance(target, int):
        os.fchown(target, uid, gid)
    else:
        os.chown(target, uid, gid)


def ensure_dirs(path: str, uid: int, gid: int) -> list[str]:
    """``mkdir -p path``, chowning each directory it creates; returns the created ones.

    On failure: :class:`InvalidArgument` when a component exists and is not a directory.
    """
    created: list[str] = []
    parts = [p for p in path.split("/") if p]
    current = ""
    for part in parts:
        current = f"{current}/{part}"
        try:
            Path(current).mkdir(0o755)
        except FileExistsError:
            if not os.path.isdir(current):
                raise InvalidArgument(f"path is a file: {current}") from None
            continue
        except OSError as exc:
            raise os_failure(exc, f"creating directory {current}") from exc
        created.append(current)
        try:
            chown_if_root(current, uid, gid, created=True)
        except OSError as exc:
            raise os_failure(exc, f"changing owner of {current}") from exc
    return created


def create_or_truncate(path: str, uid: int, gid: int) -> int:
    """Truncate or create ``path`` as a 0644 file owned by the user (like envd's processFile).

    Run as the user (``creds.as_user``): the open is what checks their permission, through
    every symlink; only root hands an existing file over to itself, as envd does.

    On failure: :class:`InvalidArgument` for a directory, :class:`NotEnoughSpace` for a full
    disk (or inode table), :class:`PermissionDenied` for a read-only place.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise os_failure(exc, f"stat '{path}'") from exc
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InvalidArgument(f"path is a directory: {path}")
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        # Opening a fifo with no reader would block a worker thread forever.
        raise InvalidArgument(f"path is not a regular file: {path}")
    try:
        if st is not None:
            chown_if_root(path, uid, gid)  # before truncating, as envd does
        # Non-blocking: a fifo put there since the check must not hang the open.
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK, 0o644
        )
    except OSError as exc:
        raise os_failure(exc, f"opening '{path}'") from exc
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidArgument(f"path is not a regular file: {path}")
        if st is None:
            chown_if_root(fd, uid, gid, created=True)
            # A process umask other than 022 must not change what uploads look like.
            if os.fstat(fd).st_mode & 0o777 != 0o644:
                os.fchmod(fd, 0o644)
    except OSError as exc:
        os.close(fd)
        raise os_failure(exc, f"changing owner of '{path}'") from exc
    return fd


def os_failure(exc: OSError, doing: str) -> AenvError:
    """The domain error for an ``OSError`` hit while ``doing`` something to a path."""
    code = exc.errno
    detail = f"{doing}: {exc.strerror or exc}"
    if code in (errno.ENOENT, errno.ENOTDIR):
        return NotFound(f"{doing}: no such file or directory")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return NotEnoughSpace(f"{doing}: not enough disk space available")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PermissionDenied(detail)
    if code in (errno.EEXIST, errno.ENOTEMPTY):
        return AlreadyExists(detail)
    if code in (errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL, errno.EXDEV,
                errno.EBUSY):
        return InvalidArgument(detail)
    return Internal(detail)
