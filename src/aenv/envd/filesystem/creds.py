"""File operations with the requesting user's permissions (issue 21, item 3).

envd runs as root; a file request for another user must be checked by the kernel as that user,
symlinks and ``..`` included, with no check-then-use window. So the work runs on a small pool of
worker threads that take on the user's credentials for the duration of one job and give them
back afterwards: ``setgroups``, ``setresgid`` and ``setresuid`` (effective ids only; the saved
uid stays 0, which is what lets the thread become root again) as raw system calls, which act
on the calling thread alone. glibc's wrappers (and so ``os.setresuid``) change every thread of
the process, which would hand envd's event loop to the user.

Measured inside gVisor (runsc 20240729, systrap) on this machine's 2 vCPUs:

* ``setfsuid``/``setfsgid`` answer ENOSYS in gVisor: not usable.
* Per-thread ``setresuid``/``setresgid``/``setgroups``: other threads keep root (checked),
  files created belong to the user, a 0600 root file is EACCES; becoming the user and back
  costs ~42 µs (6 system calls), a hop to a worker thread ~50 µs.
* ``openat2`` with ``RESOLVE_*``: ENOSYS in this gVisor, and the permission checks would have
  to be redone by hand anyway.
* A helper process per operation: 11.5 ms to spawn ``/bin/true``, 50 ms for ``python3 -S``.

A thread as a user has no effective capabilities (its euid is not 0), so nothing it does
bypasses permissions. :func:`as_root` lends root back inside a job for envd's own files (the
metadata store). Root requests run unchanged: root is unrestricted, as in E2B.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aenv.core.errors import Internal
from aenv.envd.users import User

log = logging.getLogger("aenv.envd")

T = TypeVar("T")

#: (setgroups, setresuid, setresgid) per architecture.
_SYSCALLS = {"x86_64": (116, 117, 119), "aarch64": (159, 147, 149)}
_UNCHANGED = ctypes.c_long(-1)
#: Jobs at once: listing and uploads are short; a few cover concurrent requests.
WORKERS = 4

_libc = ctypes.CDLL(None, use_errno=True)
_local = threading.local()
_executor: ThreadPoolExecutor | None = None
#: envd's own supplementary groups, restored after each job.
_root_groups: tuple[int, ...] = ()


def can_switch() -> bool:
    """Whether envd can act as other users (it runs as root; unprivileged dev runs cannot)."""
    return os.geteuid() == 0 and platform.machine() in _SYSCALLS


def _syscall(number: int, *args: Any) -> None:
    if _libc.syscall(ctypes.c_long(number), *args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _set_groups(groups: tuple[int, ...]) -> None:
    setgroups = _SYSCALLS[platform.machine()][0]
    array = (ctypes.c_uint * max(len(groups), 1))(*groups)
    _syscall(setgroups, ctypes.c_long(len(groups)), array)


def _become(user: User) -> None:
    """This thread as ``user`` (groups first: they need CAP_SETGID, which the uid change
    drops)."""
    _, setresuid, setresgid = _SYSCALLS[platform.machine()]
    _set_groups(user.groups or (user.gid,))
    _syscall(setresgid, _UNCHANGED, ctypes.c_long(user.gid), _UNCHANGED)
    _syscall(setresuid, _UNCHANGED, ctypes.c_long(user.uid), _UNCHANGED)
    _local.user = user


def _become_root() -> None:
    _, setresuid, setresgid = _SYSCALLS[platform.machine()]
    _syscall(setresuid, _UNCHANGED, ctypes.c_long(0), _UNCHANGED)
    _syscall(setresgid, _UNCHANGED, ctypes.c_long(0), _UNCHANGED)
    _set_groups(_root_groups)
    _local.user = None


def _ensure_root() -> None:
    """A worker starts every job as root; if an earlier job could not give the user's ids
    back, try once more and refuse the job rather than run it with the wrong identity."""
    if os.geteuid() == 0 and getattr(_local, "user", None) is None:
        return
    try:
        _become_root()
    except OSError as exc:
        log.critical("a file worker cannot become root again: %s", exc)
        raise Internal("file worker lost its credentials") from exc


def _run(user: User, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    if not can_switch():
        return fn(*args)
    _ensure_root()
    if user.uid == 0:
        return fn(*args)
    try:
        _become(user)
    except OSError as exc:
        _ensure_root()
        raise Internal(f"cannot act as user {user.name}: {exc}") from exc
    try:
        return fn(*args)
    finally:
        _ensure_root()


def _pool() -> ThreadPoolExecutor:
    global _executor, _root_groups
    if _executor is None:
        # Worker threads are started by the thread that submits (the event loop's, root),
        # and inherit its credentials.
        _root_groups = tuple(os.getgroups())
        _executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="envd-files")
    return _executor


async def as_user(user: User, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread with ``user``'s permissions."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), _run, user, fn, args)


@contextlib.contextmanager
def as_root() -> Iterator[None]:
    """Root for the block, inside a job running as a user (a no-op elsewhere)."""
    user: User | None = getattr(_local, "user", None)
    if user is None:
        yield
        return
    _become_root()
    try:
        yield
    finally:
        _become(user)
