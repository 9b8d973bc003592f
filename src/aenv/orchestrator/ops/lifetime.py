"""Timeouts: set (may shorten), extend only (connect), refresh (legacy keep-alive)."""

from __future__ import annotations

from aenv.core.timeouts import check_timeout
from aenv.orchestrator.context import Node
from aenv.store.models import SandboxRecord


async def set_timeout(
    node: Node, sandbox_id: str, seconds: int, *, allow_shorter: bool = True
) -> SandboxRecord:
    """``end_at = now + seconds`` (or the later of both when ``allow_shorter`` is false).

    Prerequisites: the sandbox exists. On success: the new end time is stored.
    On failure: ``NotFound`` (gone or being killed), ``InvalidArgument`` beyond the maximum.
    """
    check_timeout(node.settings, seconds)
    record = await node.store.require_visible(sandbox_id)
    end = node.clock() + seconds
    if not allow_shorter:
        end = max(end, record.end_at)
    # Not a turn of the sandbox's: the end time is no part of any operation's work, so it is
    # written beside whatever holds the sandbox (a pause, a resume) without conflicting.
    record = await node.store.set_end_at(sandbox_id, end)
    if allow_shorter:  # the user's own timeout (a connect's extension is no new setting)
        await node.store.add_event(sandbox_id, "updated", {"what": "timeout"},
                                   team_id=record.team_id, record=record)
    return record
