"""Freeze and thaw of a gVisor sandbox over its control socket, and the marker file that keeps
what runsc's state file does not.

``containerManager.Pause`` / ``Resume`` on the control socket take well under a millisecond
(the CLI ~25-50 ms here), but runsc's state file still says "running" afterwards, so the truth
is kept in the sandbox's ``pause-state`` file: ``freezing`` before the call, ``frozen`` once it
answered, ``thawing`` while a resume is under way. A crash in between leaves ``freezing`` (or
``thawing``): the sandbox is *in doubt*, which recovery resolves by writing it to disk (a
checkpoint is right whether or not the pause took effect; a resume of a sandbox that is not
paused would kill it, and pauses nest in the sentry, so one resume would not undo two).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aenv.core.errors import FailedPrecondition, InDoubt
from aenv.runtime import urpc
from aenv.runtime.runsc import Runsc, map_runsc_errors

FREEZING, FROZEN, THAWING = "freezing", "frozen", "thawing"
MARKER = "pause-state"


def read_marker(path: Path) -> str | None:
    """The marker's state, or None when there is none (the sandbox is not paused by us)."""
    try:
        # Empty: a crash while it was written, so a call may have been under way: in doubt.
        return path.read_text().strip() or FREEZING
    except FileNotFoundError:
        return None


def observed_status(marker: Path) -> str | None:
    """What ``observe`` reports for a sandbox runsc says runs: ``paused``, ``in-doubt``, or
    None (it runs)."""
    state = read_marker(marker)
    if state is None:
        return None
    return "paused" if state == FROZEN else "in-doubt"


async def freeze(runsc: Runsc, runtime_id: str, sandbox_id: str, marker: Path) -> None:
    """Stop every task of the sandbox. Refuses a frozen sandbox (``FailedPrecondition``) and
    raises ``InDoubt`` for one in doubt."""
    state = read_marker(marker)
    if state == FROZEN:
        raise FailedPrecondition(f"sandbox {sandbox_id} is frozen")
    if state is not None:
        raise InDoubt(f"sandbox {sandbox_id} is {state}: its pause is in doubt")
    await _control(runsc, runtime_id, "containerManager.Pause", marker, FREEZING, undo=None)
    marker.write_text(FROZEN)


async def thaw(runsc: Runsc, runtime_id: str, sandbox_id: str, marker: Path) -> None:
    """Continue a sandbox ``freeze`` stopped. Refuses one that it did not stop
    (``FailedPrecondition``) or whose pause is in doubt (``InDoubt``): the sentry would kill a
    sandbox that is resumed while it runs. A sandbox paused with ``runsc pause`` (an older
    aenv) is resumed with ``runsc resume``."""
    state = read_marker(marker)
    if state is None:
        with map_runsc_errors(sandbox_id, "state"):
            current = await runsc.state(runtime_id)
        if current.status != "paused":
            raise FailedPrecondition(f"sandbox {sandbox_id} is {current.status}, not paused")
        with map_runsc_errors(sandbox_id, "resume"):
            await runsc.resume(runtime_id)
        return
    if state != FROZEN:
        raise InDoubt(f"sandbox {sandbox_id} is {state}: its pause is in doubt")
    await _control(runsc, runtime_id, "containerManager.Resume", marker, THAWING, undo=FROZEN)
    marker.unlink(missing_ok=True)


async def _control(runsc: Runsc, runtime_id: str, method: str, marker: Path, during: str, *,
                   undo: str | None) -> None:
    """``method`` on the sandbox's control socket, ``marker`` saying ``during`` while the call
    may be under way. Refused or never sent: the marker goes back to ``undo`` (None: removed).
    No answer, or cancelled: ``during`` stays, in doubt."""
    marker.write_text(during)
    try:
        await urpc.call(runsc.control_socket(runtime_id), method)
    except (urpc.CallInDoubt, asyncio.CancelledError):
        raise
    except BaseException:
        if undo is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(undo)
        raise
