"""``openat2(2)`` with ``RESOLVE_IN_ROOT``: open a path below a directory fd as if chrooted
into it (``..`` and symlinks, absolute ones included, resolve inside it), crossing no mount
(``RESOLVE_NO_XDEV``) and no magic link (``RESOLVE_NO_MAGICLINKS``).

Called through ``ctypes`` by hand because nothing offers it: ``os`` has no wrapper (as of
Python 3.13) and no library we may depend on has one; ``realpath`` plus a prefix check is
exactly the check-then-use race this exists to avoid. Used by ``volume_files.py``.
"""

from __future__ import annotations

import ctypes
import errno
import os

# openat2 got one number on every architecture (new syscalls share a single table since 5.x).
_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
# With RESOLVE_IN_ROOT the kernel answers EAGAIN when a rename raced a ".." walk; worth retrying,
# but a sandbox renaming in a loop must not keep a node thread spinning forever.
_RETRIES = 32


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def open_in_root(dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """``openat2(dir_fd, path, flags, mode)`` resolved inside ``dir_fd``; raises ``OSError``."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    raw = os.fsencode(path)
    err = errno.EAGAIN
    for _ in range(_RETRIES):
        fd = _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(raw),
            ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):
            break
    raise OSError(err, os.strerror(err), path)
