"""The two start-up locks of a node: its home, and its network-slot range on this machine.

Two node processes must never recover or sweep the same things: both would re-attach (or tear
down) the same sandboxes, and a start-up sweep deletes every network slot of its range that it
did not adopt, which is every slot of the other node. So a node takes, before it touches
anything:

- ``<home>/node.lock``: an exclusive ``flock`` on the whole file; the holder writes its pid
  into it (for the message of the one refused).
- the byte range ``[first, last + 1)`` of one machine-wide file (default
  ``/run/aenv/net-slots.lock``): a POSIX record lock (``F_SETLK``), so overlapping slot ranges
  conflict and disjoint ones do not. ``F_GETLK`` names the holder's pid and range.

Both locks belong to the open file: the kernel drops them when the process exits, however it
exits (``kill -9`` included), so a lock is never stale and there is nothing to clean up. They
are held for the process lifetime; ``release()`` exists for tests.

Owns: ``<home>/node.lock`` and the slot lock file. Must not touch: anything else in the home.
A POSIX record lock is the process's, not the descriptor's: closing *any* descriptor of the
slot lock file in this process drops it, so nothing else may open that file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import FailedPrecondition

#: The machine-wide slot lock: under /run, so a reboot (which also removes every netns)
#: starts with no lock file.
SLOT_LOCK_PATH = Path("/run/aenv/net-slots.lock")
HOME_LOCK_NAME = "node.lock"

#: ``struct flock`` on Linux (x86-64 and arm64): short l_type, short l_whence, off_t l_start,
#: off_t l_len, pid_t l_pid, padded to 32 bytes.
_FLOCK = "hhqqi4x"


@dataclass
class HeldLock:
    """An open lock file; the lock lasts as long as the descriptor (or the process)."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_home(home: Path) -> HeldLock:
    """Take ``<home>/node.lock`` for this process.

    Prerequisites: ``home`` exists or can be created.
    On success: this process holds the exclusive lock and its pid is in the file.
    On failure: ``FailedPrecondition`` naming the holder ("another aenv node (pid N) is using
    AENV_HOME=…") when another process holds it; nothing else in the home was touched.
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / HOME_LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise FailedPrecondition(
            f"another aenv node (pid {holder}) is using AENV_HOME={home}; stop it first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return HeldLock(path, fd)


def lock_slot_range(first: int, last: int, path: Path = SLOT_LOCK_PATH) -> HeldLock:
    """Take slots ``first..last`` (inclusive) for this process, machine-wide.

    Prerequisites: ``1 <= first <= last``; ``path``'s directory can be created.
    On success: this process holds a write lock on bytes ``[first, last + 1)`` of ``path``.
    On failure: ``FailedPrecondition`` naming the conflicting holder's pid and slot range when
    another process holds an overlapping range.
    """
    if not 1 <= first <= last:
        raise FailedPrecondition(f"bad network slot range {first}..{last}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    length = last - first + 1
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, first, os.SEEK_SET)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise
        holder = _holder(fd, first, length)
        os.close(fd)
        raise FailedPrecondition(
            f"network slots {first}..{last} overlap those of another aenv node{holder} on "
            "this machine; give this node a disjoint AENV_NET_FIRST_INDEX..AENV_NET_LAST_INDEX"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return HeldLock(path, fd)


def _holder(fd: int, start: int, length: int) -> str:
    """`` (pid N, slots a..b)`` for the first lock in the way, or ``""`` if it went away."""
    query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    with contextlib.suppress(OSError):
        l_type, _, l_start, l_len, l_pid = struct.unpack(
            _FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query)
        )
        if l_type != fcntl.F_UNLCK:
            # l_len 0 means "to the end of the file" (no node takes that, but be exact).
            end = "…" if l_len == 0 else str(l_start + l_len - 1)
            return f" (pid {l_pid}, slots {l_start}..{end})"
    return ""
