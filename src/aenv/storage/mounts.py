"""The host's mount table and (un)mounting: shared by the layer store and rootfs assembly."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, Conflict

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


#: What ``umount`` says when there is nothing (left) to unmount: another process (a node
#: shutting down, a person) unmounted it between our look at the mount table and our call.
_ALREADY_GONE = ("not mounted", "no mount point specified", "No such file or directory")


async def unmount(target: str, *, lazy: bool, what: str) -> None:
    """Unmount ``target``. Idempotent: nothing mounted there (any more) counts as done.

    On failure: ``Conflict`` if it is busy (without ``lazy``), else ``CommandError``.
    """
    argv = ["umount", "--lazy", target] if lazy else ["umount", target]
    try:
        await proc.run(argv, timeout=MOUNT_TIMEOUT_S)
    except CommandError as exc:
        if "busy" in exc.stderr:
            raise Conflict(f"{what} is busy: {exc.stderr.strip()}") from exc
        if any(text in exc.stderr for text in _ALREADY_GONE):
            return
        raise
