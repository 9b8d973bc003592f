"""Waiting for a process that is not our child, and reading why it ended (Linux).

runsc's sandbox processes are not the server's children (they run in sessions of their own,
re-parented to init or adopted by the node as their subreaper, ``runtime/reaper.py``, and
outlive a server restart), so ``waitpid(2)`` is not how they are waited for. A
pidfd can: ``pidfd_open(2)`` (Linux >= 5.3) gives a descriptor that becomes readable once the
process has exited, which the event loop watches like a socket — no thread, no polling, the
wake-up follows the exit within milliseconds. Where pidfds are not available (``ENOSYS``, or
refused), the process is polled every ``POLL_S`` instead.

Its wait status: while the exited process is a zombie (init has not reaped it yet; this machine's
PID 1 takes ~1 s), field 52 of ``/proc/<pid>/stat`` holds its wait status; once reaped, the
pidfd still has it through ``PIDFD_GET_INFO`` (Linux >= 6.15). Either may be unavailable: the
status is then unknown (None), never guessed. ``reason`` combines it with what the host
kept: the memory cgroup's OOM-kill counter, the pids cgroup's count of refused forks, a Go
panic in the runtime's logs.

Owns: nothing; reads ``/proc``, cgroup files and logs. Must not touch: the process (no
signals, no reaping), the cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import struct
from collections.abc import Sequence
from pathlib import Path

from aenv.runtime import cgroups
from aenv.runtime.base import Exit

#: The polling fallback's period: a death is noticed within this (plus a /proc read).
POLL_S = 0.25

#: ``PIDFD_GET_INFO``: _IOWR(0xFF, 11, struct pidfd_info), version 0 of the struct (64 bytes:
#: mask, cgroupid, then 11 u32 ids, then the s32 exit_code).
_PIDFD_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_INFO = struct.Struct("=QQ11Ii")
#: A Go panic (runsc's sentry and gofer are Go), as its log or stderr shows it.
_PANIC = re.compile(r"^(panic: .*|fatal error: .*)$", re.MULTILINE)
_SIGNALS = {int(s) for s in signal.Signals}
#: How much of each log's end is searched for a panic.
_LOG_TAIL = 64_000


async def wait_exit(pid: int, *, cmdline_has: bytes) -> int | None:
    """Wait until process ``pid`` has exited; its wait status (``os.WIFSIGNALED`` etc.) when
    it can still be read, else None.

    ``cmdline_has``: bytes the process's command line contains — a process without them (the
    pid was reused after ours died) counts as ours having exited already.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # gone (and reaped) before we looked
    except OSError:
        return await _poll(pid, cmdline_has)
    try:
        # The pidfd pins the process it was opened for; a look at its command line now tells
        # whether that is still ours (a pid is reused only after its zombie is reaped).
        if not _is_ours(pid, cmdline_has):
            return None
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def on_readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            await exited
        finally:
            loop.remove_reader(fd)
        return _zombie_status(pid) if _zombie_status(pid) is not None else _pidfd_status(fd)
    finally:
        os.close(fd)


async def _poll(pid: int, cmdline_has: bytes) -> int | None:
    # Nothing in this process can be told of another's exit without a pidfd: poll.
    while _is_ours(pid, cmdline_has) and _zombie_status(pid) is None:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    return _zombie_status(pid)


def _is_ours(pid: int, cmdline_has: bytes) -> bool:
    try:
        return cmdline_has in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _zombie_status(pid: int) -> int | None:
    """The wait status of ``pid`` if it is a zombie (exited, not reaped), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); field 52 (exit_code) is fields[49].
    if fields[0] != "Z" or len(fields) < 50:
        return None
    with contextlib.suppress(ValueError):
        return int(fields[49])
    return None


def _pidfd_status(fd: int) -> int | None:
    """The wait status kept on the pidfd of a reaped process (Linux >= 6.15), else None."""
    buf = bytearray(_PIDFD_INFO.pack(_PIDFD_INFO_EXIT, 0, *([0] * 11), 0))
    try:
        fcntl.ioctl(fd, _PIDFD_GET_INFO, buf)
    except OSError:
        return None  # an older kernel, or not reaped yet
    fields = _PIDFD_INFO.unpack(buf)
    return fields[-1] if fields[0] & _PIDFD_INFO_EXIT else None


def reason(status: int | None, *, cgroup: str, logs: Sequence[Path]) -> Exit:
    """Why a runtime ended, most specific first: OOM kills counted in memory cgroup
    ``cgroup`` (relative to the cgroup root) → ``out-of-memory``; forks refused by its pids
    cgroup → ``pids-limit``; a panic line in the tail of one of ``logs`` → ``crashed``; the
    wait status ``status``: a signal → ``killed``, else
    ``exited``. Read it before the cgroup and logs are removed."""
    kills, limit = cgroups.oom_kills(cgroup)
    if kills:
        size = f" of {limit // (1024 * 1024)} MiB" if 0 < limit < 1 << 60 else ""
        return Exit(
            "out-of-memory",
            f"out of memory: the sandbox used all its memory{size} "
            "and the host's memory cgroup killed its runtime",
        )
    hits, pids = cgroups.pids_limit_hits(cgroup)
    if hits and not (status is not None and os.WIFSIGNALED(status)):
        # The sentry panics when it cannot start a host thread or stub process: it exits
        # with status 2 and, without debug logs, says nothing else.
        size = f" of {pids} host tasks" if pids else ""
        return Exit(
            "pids-limit",
            f"too many processes: the sandbox reached its host pids limit{size} "
            f"({hits} forks refused, e.g. a fork bomb) and its runtime died",
        )
    for path in logs:
        found = _PANIC.search(_tail(path))
        if found is not None:
            return Exit("crashed", f"the sandbox's runtime crashed: {found.group(1)[:300]}")
    if status is not None and os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return Exit("killed", f"the sandbox's runtime was killed by {name}")
    if status is not None and os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        # runsc mirrors a signal that ended part of the sandbox (e.g. its gofer killed:
        # measured 137) as 128 + the signal's number.
        hint = f" (128 + {signal.Signals(code - 128).name})" if code - 128 in _SIGNALS else ""
        return Exit("exited", f"the sandbox's runtime exited with status {code}{hint}")
    return Exit("exited", "the sandbox's runtime exited (status unknown)")


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError), path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - _LOG_TAIL))
        return f.read().decode("utf-8", "replace")
    return ""
