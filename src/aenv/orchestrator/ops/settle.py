"""Wait for a sandbox to leave a transitional state (another operation holds it)."""

from __future__ import annotations

import asyncio
import time

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.store.models import SandboxRecord

#: States another operation holds and will leave on its own.
TRANSITIONAL = frozenset({SandboxState.CREATING, SandboxState.PAUSING, SandboxState.RESUMING,
                          SandboxState.SNAPSHOTTING, SandboxState.FORKING})
_POLL_S = 0.01
_POLL_MAX_S = 0.1


async def settled(node: Node, sandbox_id: str) -> SandboxRecord:
    """The sandbox's record once it is in no transitional state.

    On failure: ``NotFound`` (gone meanwhile), ``Conflict`` after ``transition_wait_s``.
    """
    deadline = time.monotonic() + node.settings.transition_wait_s
    pause = _POLL_S
    while True:
        record = await node.store.require(sandbox_id)
        if record.state not in TRANSITIONAL:
            return record
        if time.monotonic() >= deadline:
            raise Conflict(f"sandbox {sandbox_id} is {record.state}; try again")
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, _POLL_MAX_S)
