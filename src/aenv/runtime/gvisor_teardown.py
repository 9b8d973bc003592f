"""Ending a gVisor sandbox's processes: ``runsc delete`` and what it leaves.

``runsc delete`` kills the sandbox and waits until the killed process is reaped; the node
is who reaps it (its subreaper: ``reaper.py``), so the wait reaps as it goes. runsc does not
wait for the gofer: until it has exited it may still flush files into a rootfs that is
unmounted or a disk that is detached next (a busy mount, or a damaged file system seen as
"Structure needs cleaning"), so the delete waits for it too, for at most
``EXIT_TIMEOUT_S``. And runsc knows only the processes its state file names: a run or
restore cut short before that file was written leaves processes in the sandbox's cgroup
that no delete finds; ``kill_left`` kills those (thawing the cgroup first).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path

from aenv.runtime import cgroups, reaper
from aenv.runtime.runsc import Runsc

log = logging.getLogger("aenv.runtime")

#: How often a delete in progress looks for the processes it killed, to reap them.
REAP_POLL_S = 0.02
#: A gofer exits within milliseconds of its sandbox; past this, the delete goes on (logged).
EXIT_TIMEOUT_S = 10.0


async def delete(runsc: Runsc, state_dir: Path, runtime_id: str, pid: int | None) -> None:
    """``runsc delete runtime_id`` (sandbox ``pid``), then the gofer's exit.

    A state file runsc cannot read (empty or cut short: runsc rewrites it in place, and a
    node killed while a runsc command wrote it leaves it so) makes every ``runsc delete``
    fail, for good: the sandbox is then ended without runsc — its process killed, the file
    removed — and ``kill_left`` ends what else is in its cgroup."""
    state = state_file(state_dir, runtime_id)
    if _unreadable(state):
        log.warning("runsc's state file of %s is unreadable (a write cut short): ending the "
                    "sandbox without runsc", runtime_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await _wait_gone([pid])
        state.unlink(missing_ok=True)
        return
    pids = [p for p in (pid, gofer_pid(state_dir, runtime_id)) if p is not None]
    running = asyncio.ensure_future(runsc.delete(runtime_id))
    try:
        while not running.done():
            reaper.reap(pids)
            await asyncio.wait([running], timeout=REAP_POLL_S)
    except BaseException:
        running.cancel()
        raise
    await running
    if left := await _wait_gone(pids):
        log.warning("runtime processes %s of %s outlived its delete by %.0f s", left,
                    runtime_id, EXIT_TIMEOUT_S)


async def kill_left(cgroup: str, runtime_id: str) -> None:
    """Kill what is still in the sandbox's ``cgroup`` and wait for it to exit."""
    killed = cgroups.kill_left(cgroup)
    if killed:
        log.warning("killed %d processes of %s that its delete left: %s", len(killed),
                    runtime_id, sorted(killed))
        await _wait_gone(sorted(killed))


def state_file(state_dir: Path, runtime_id: str) -> Path:
    """runsc's state file of sandbox ``runtime_id`` (runsc 20240729's naming)."""
    return state_dir / "runsc" / f"{runtime_id}_sandbox:{runtime_id}.state"


def _unreadable(path: Path) -> bool:
    """The file exists but is not a JSON object (missing is not unreadable: runsc says
    "not found" itself)."""
    try:
        return not isinstance(json.loads(path.read_bytes() or b"null"), dict)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True


def gofer_pid(state_dir: Path, runtime_id: str) -> int | None:
    """The gofer's pid from runsc's state file (None if it has none or is unreadable)."""
    path = state_file(state_dir, runtime_id)
    try:
        pid = json.loads(path.read_text()).get("goferPid")
    except (OSError, ValueError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _wait_gone(pids: list[int]) -> list[int]:
    """Reap ``pids`` as they exit; those still alive after ``EXIT_TIMEOUT_S``."""
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while True:
        reaper.reap(pids)
        left = [p for p in pids if pid_alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(REAP_POLL_S)
