"""Kill a sandbox (running or paused).

Prerequisites: the sandbox exists and is not in the middle of another operation.
On success: its processes are gone, open streams through the proxy are aborted, its writable
layer and network slot are released and the record is deleted.
On failure: ``NotFound``; ``Conflict`` while another operation holds it. A crash mid-kill leaves
a ``killing`` record that recovery finishes.
"""

from __future__ import annotations

import asyncio

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.settle import TRANSITIONAL, settled
from aenv.orchestrator.ops.teardown import teardown
from aenv.store.models import SandboxRecord

_KILLABLE = {SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.KILLING}


async def kill(node: Node, sandbox_id: str) -> None:
    record = await node.store.require(sandbox_id)
    if record.state in TRANSITIONAL:
        record = await settled(node, sandbox_id)  # a pause being written, a snapshot...
    if record.state not in _KILLABLE:
        raise Conflict(f"sandbox {sandbox_id} is {record.state}; try again")
    if record.state != SandboxState.KILLING:
        record = await node.store.update(record, state=SandboxState.KILLING)
    # Once marked, finish even if the caller goes away.
    await asyncio.shield(_finish(node, record))


async def _finish(node: Node, record: SandboxRecord) -> None:
    await teardown(node, record)
    await node.store.delete(record)
