"""A fresh sandbox rootfs's writable /tmp and the sandbox user's home, made without trusting
the image: every step works through directory file descriptors and never follows a symlink.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from aenv.core.errors import InvalidArgument
from aenv.storage.image_files import lookup_user

#: Who the sandbox's unprivileged user is when the rootfs does not say (E2B's ``user``).
DEFAULT_USER_UID = 1000
DEFAULT_USER_GID = 1000


def prepare_user_dirs(rootfs: Path) -> None:
    """Give the sandbox user a writable /tmp and home when the layers lack them. Blocking.

    The merged tree comes from an image, which is untrusted: every step refuses to follow a
    symlink (``/tmp -> /etc`` must not make the host's /etc world-writable) and works through
    directory file descriptors.
    """
    uid, gid = _lookup_user(rootfs)
    root_fd = os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _ensure_dir_at(root_fd, "tmp", 0o1777, 0, 0, fix_mode=True)
        home_fd = _ensure_dir_at(root_fd, "home", 0o755, 0, 0, fix_mode=False, keep_open=True)
        if home_fd is not None:
            try:
                _ensure_dir_at(home_fd, "user", 0o755, uid, gid, fix_mode=False)
            finally:
                os.close(home_fd)
    finally:
        os.close(root_fd)


def _ensure_dir_at(
    dir_fd: int,
    name: str,
    mode: int,
    uid: int,
    gid: int,
    *,
    fix_mode: bool,
    keep_open: bool = False,
) -> int | None:
    """Create ``name`` in ``dir_fd`` if missing (mode, owner); never through a symlink.

    Returns an open fd of the directory when ``keep_open`` (``None`` if it is not a plain
    directory, in which case nothing is touched).
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.mkdir(name, mode, dir_fd=dir_fd)
        created = True
    else:
        if not stat.S_ISDIR(st.st_mode):
            return None  # a symlink or file: the image's business, never followed
        created = False
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if created:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        elif fix_mode and stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    if keep_open:
        return fd
    os.close(fd)
    return None


def _lookup_user(rootfs: Path) -> tuple[int, int]:
    """uid and gid of ``user`` in the image's /etc/passwd, else E2B's 1000:1000 (read with
    symlinks resolved inside the image: its ``/etc`` pointing at the host's must not make us
    read host files)."""
    try:
        found = lookup_user(rootfs, "user")
    except InvalidArgument:
        return DEFAULT_USER_UID, DEFAULT_USER_GID
    return found.uid, found.gid
