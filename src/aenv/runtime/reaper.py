"""The node as its runtime processes' *subreaper*: it adopts and reaps them itself.

runsc's sandbox and gofer processes outlive the CLI that started them (they must: a sandbox
survives the node). Without a subreaper they are re-parented to PID 1, and ``runsc delete``
polls (every 100 ms) until PID 1 has reaped the killed processes: on a host whose init reaps
slowly every kill takes that long (this VM's: ~2 s a kill). With ``PR_SET_CHILD_SUBREAPER`` the
node adopts them instead and reaps them within milliseconds of their exit; a node that dies
hands them to PID 1 again, and the sandboxes keep running.

Only adopted processes are reaped here. The node's own subprocesses (``core/proc.py``) are
waited for by asyncio, and reaping one would lose its exit status, so ``reap_adopted`` leaves
alone every pid ``proc.spawned()`` names and every zombie younger than ``MIN_AGE_S`` (a child
asyncio has just started and ``proc`` has not registered yet), unless the caller names it: a
sandbox's own pid, which no ``proc`` call ever started.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from aenv.core import proc

log = logging.getLogger("aenv.runtime.reaper")

_PR_SET_CHILD_SUBREAPER = 36
#: A zombie child not started by ``proc`` is reaped only once it is this old (seconds).
MIN_AGE_S = 1.0
#: How often ``sweep`` looks for adopted zombies nobody else reaps.
SWEEP_S = 5.0
_TICKS = os.sysconf("SC_CLK_TCK")


def become_subreaper() -> bool:
    """Make this process its descendants' subreaper (Linux); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    except (OSError, AttributeError) as exc:
        log.warning("cannot become the runtime processes' subreaper: %s", exc)
        return False
    return True


def reap_adopted(named: Iterable[int] = ()) -> list[int]:
    """Reap the adopted children that have exited (see the module docstring); their pids."""
    own = proc.spawned()
    wanted = set(named)
    reaped = []
    for pid in _children():
        if pid in own:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] != "Z":
            continue
        if pid not in wanted and _age_s(stat[1]) < MIN_AGE_S:
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def reap(pids: Iterable[int]) -> list[int]:
    """Reap those of ``pids`` (adopted runtime processes: a sandbox's, its gofer's) that have
    exited; their pids. Only these: a delete in progress polls every few milliseconds, and
    :func:`reap_adopted`'s walk over every child of the node (each of its threads' list,
    each child's stat) cost 17 % of the node's event loop while 16 sandboxes were deleted at
    once. A pid the node's ``proc`` started is left to asyncio, as there."""
    own = proc.spawned()
    reaped = []
    for pid in pids:
        if pid in own:
            continue
        with contextlib.suppress(ChildProcessError):  # not (or no longer) our child
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped.append(pid)
    return reaped


def _children() -> set[int]:
    found: set[int] = set()
    for path in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found.update(int(x) for x in path.read_text().split())
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """State letter and start time (clock ticks since boot) of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _age_s(start_ticks: int) -> float:
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return 0.0
    return uptime - start_ticks / _TICKS


async def sweep(interval_s: float = SWEEP_S) -> None:
    """Reap, every ``interval_s``, adopted processes that no ``runsc delete`` waited for (a
    runtime helper that exited on its own)."""
    while True:
        await asyncio.sleep(interval_s)
        reaped = reap_adopted()
        if reaped:
            log.debug("reaped adopted processes %s", reaped)
