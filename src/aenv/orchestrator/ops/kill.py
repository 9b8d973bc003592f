"""Kill a sandbox (running or paused).

Prerequisites: the sandbox exists and is not in the middle of another operation.
On success: its processes are gone, open streams through the proxy are aborted, its writable
layer and network slot are released and the record is deleted.
On failure: ``NotFound``; ``Conflict`` while another operation holds it. A crash mid-kill leaves
a ``killing`` record that recovery finishes.
"""

from __future__ import annotations

import asyncio
import logging

from aenv.core.errors import AenvError, Conflict, NotFound
from aenv.core.states import SandboxState
from aenv.orchestrator import disk_mode, paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.settle import TRANSITIONAL, settled
from aenv.orchestrator.ops.teardown import teardown
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.kill")

_KILLABLE = {SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.KILLING}


async def kill(node: Node, sandbox_id: str) -> None:
    try:
        record = await node.store.require(sandbox_id)
    except NotFound:
        # Paused into the repository by another node: killing it is deleting that state.
        if await node.repository.lookup(paused_repo.paused_id(sandbox_id)) is None:
            raise
        await paused_repo.unpublish(node, sandbox_id)
        return
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
    disk_mode.forget(node, record.sandbox_id)
    if paused_repo.published(record):
        try:
            await paused_repo.unpublish(node, record.sandbox_id)
        except AenvError as exc:
            # The sandbox is gone here; a stale manifest only wastes space until GC.
            log.warning("killed %s, but could not remove its paused manifest: %s",
                        record.sandbox_id, exc.message)
    await node.store.delete(record)
