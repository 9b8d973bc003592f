"""Timeouts: set (may shorten), extend only (connect), refresh (legacy keep-alive)."""

from __future__ import annotations

from aenv.core.errors import Conflict, InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.store.models import SandboxRecord

_RETRIES = 5


def _check(node: Node, seconds: int) -> None:
    if seconds > node.settings.max_timeout_s:
        raise InvalidArgument(
            f"timeout {seconds}s exceeds the maximum of {node.settings.max_timeout_s}s"
        )


async def set_timeout(
    node: Node, sandbox_id: str, seconds: int, *, allow_shorter: bool = True
) -> SandboxRecord:
    """``end_at = now + seconds`` (or the later of both when ``allow_shorter`` is false).

    Prerequisites: the sandbox exists. On success: the new end time is stored.
    On failure: ``NotFound``, ``InvalidArgument`` beyond the maximum, ``Conflict`` if the
    sandbox keeps changing under us.
    """
    _check(node, seconds)
    for _ in range(_RETRIES):
        record = await node.store.require(sandbox_id)
        if record.state == SandboxState.KILLING:
            raise Conflict(f"sandbox {sandbox_id} is being killed")
        end = node.clock() + seconds
        if not allow_shorter:
            end = max(end, record.end_at)
        try:
            return await node.store.update(record, end_at=end)
        except Conflict:
            continue
    raise Conflict(f"sandbox {sandbox_id} is busy; try again")
