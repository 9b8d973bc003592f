"""Connect to a sandbox: a running one only has its lifetime extended.

Prerequisites: the sandbox exists. On success: ``(record, resumed)``; for a running sandbox the
end time is ``max(end, now + timeout)`` and ``resumed`` is false. On failure: ``NotFound``;
``Conflict`` while it is in a transitional state.
"""

from __future__ import annotations

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.lifetime import set_timeout
from aenv.store.models import SandboxRecord


async def connect(
    node: Node, sandbox_id: str, timeout_s: int | None
) -> tuple[SandboxRecord, bool]:
    record = await node.store.require(sandbox_id)
    if record.state == SandboxState.RUNNING:
        seconds = node.settings.default_timeout_s if timeout_s is None else timeout_s
        return await set_timeout(node, sandbox_id, seconds, allow_shorter=False), False
    raise Conflict(f"sandbox {sandbox_id} is {record.state}; try again")
