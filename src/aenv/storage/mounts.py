"""The host's mount table and (un)mounting: shared by the layer store and rootfs assembly."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import CommandError, CommandTimeout, Conflict

#: A mount or unmount that takes longer is stuck (a hung FUSE or NFS lower, say).
MOUNT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class MountInfo:
    """One line of ``/proc/self/mountinfo`` (the fields we use)."""

    mount_id: int
    mount_point: str
    fstype: str
    source: str
    super_options: dict[str, str]


def read_mountinfo(path: str = "/proc/self/mountinfo") -> list[MountInfo]:
    """Parse the mount table of this process's mount namespace.

    Prerequisites: /proc is mounted.
    On success: every mount, in mount order (later mounts stack over earlier ones).
    On failure: ``OSError`` if the table cannot be read.
    """
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        lines = fh.read().splitlines()
    mounts: list[MountInfo] = []
    for line in lines:
        # Fields: id, parent, dev, root, mount point, options, [optional...], "-", fstype,
        # source, super options (see proc(5)).
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split(" ")
        tail = right.split(" ")
        if len(fields) < 5 or len(tail) < 3:
            continue
        options: dict[str, str] = {}
        for item in tail[2].split(","):
            key, _, value = item.partition("=")
            options[key] = _unescape(value)
        mounts.append(
            MountInfo(
                mount_id=int(fields[0]),
                mount_point=_unescape(fields[4]),
                fstype=tail[0],
                source=_unescape(tail[1]),
                super_options=options,
            )
        )
    return mounts


def _unescape(text: str) -> str:
    # The kernel escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mounts_under(path: Path) -> list[str]:
    """Mount points inside ``path`` (or on it), innermost first, from this mount namespace."""
    real = os.path.realpath(path)
    inside = [
        m.mount_point
        for m in read_mountinfo()
        if m.mount_point == real or m.mount_point.startswith(real + "/")
    ]
    return sorted(inside, key=len, reverse=True)


#: umount2(2) flags (linux/fs.h): detach now, finish when no longer busy; and never follow a
#: symlink in place of the mount point.
_MNT_DETACH = 2
_UMOUNT_NOFOLLOW = 8
_libc = ctypes.CDLL(None, use_errno=True)


async def unmount(target: str, *, lazy: bool, what: str) -> None:
    """Unmount ``target``. Idempotent: nothing mounted there (any more) counts as done.

    The system call, not ``umount(8)``: a node unmounts two or three times per sandbox it
    ends, and each ``umount`` process cost ~3 ms of CPU (libmount reads the mount table)
    plus its spawn, on two cores that restores need. In a thread: an unmount waits for the
    file system's last writes.

    On failure: ``Conflict`` if it is busy (without ``lazy``), else ``CommandError``
    (``CommandTimeout`` past ``MOUNT_TIMEOUT_S``: a hung file system; the call is left to end
    in its thread).
    """
    flags = _UMOUNT_NOFOLLOW | (_MNT_DETACH if lazy else 0)
    argv = ["umount2", target, "MNT_DETACH" if lazy else "0"]
    try:
        async with asyncio.timeout(MOUNT_TIMEOUT_S):
            err = await asyncio.to_thread(_umount2, target, flags)
    except TimeoutError:
        raise CommandTimeout(argv, None, f"no answer within {MOUNT_TIMEOUT_S:.0f}s") from None
    # EINVAL: not a mount point (any more: another unmount came first); ENOENT: no such path.
    if err in (0, errno.EINVAL, errno.ENOENT):
        return
    if err == errno.EBUSY:
        raise Conflict(f"{what} is busy: {target}: {os.strerror(err)}")
    raise CommandError(argv, err, f"{target}: {os.strerror(err)}")


def _umount2(target: str, flags: int) -> int:
    """umount2(2); 0 or the errno."""
    if _libc.umount2(os.fsencode(target), flags) == 0:
        return 0
    return ctypes.get_errno()
