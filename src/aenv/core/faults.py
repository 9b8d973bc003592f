"""Crash points for fault-injection tests: the process kills itself at a named step.

``crash_at`` (the ``AENV_CRASH_AT`` setting, ``step`` or ``step:N`` for the N-th time the step
is reached) makes :func:`fault` send this process SIGKILL there — no clean-up, no flush, exactly
what a power cut or an OOM kill of the server does. Unset (always, outside tests) it is one
comparison. Steps are named where they are placed (``"commit.blobs"``, ``"spill.checkpointed"``
…); ``docs/repository.md`` lists them.
"""

from __future__ import annotations

import os
import signal

_armed: tuple[str, int] | None = None
_seen: dict[str, int] = {}


def arm(crash_at: str | None) -> None:
    """Set the crash point (from the settings, once at start)."""
    global _armed
    if not crash_at:
        _armed = None
        return
    step, _, count = crash_at.partition(":")
    _armed = (step, int(count) if count else 1)


def fault(step: str) -> None:
    """Die here if this is the armed step (its N-th passage)."""
    if _armed is None or _armed[0] != step:
        return
    _seen[step] = _seen.get(step, 0) + 1
    if _seen[step] >= _armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)
