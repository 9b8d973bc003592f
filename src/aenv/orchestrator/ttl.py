"""The TTL loop: sandboxes past their end time are paused (created with ``autoPause``) or
killed.

Runs as one supervised task of the server; each expiry is handled independently, so one slow
teardown does not hold the others.
"""

from __future__ import annotations

import asyncio
import logging

from aenv.core.errors import AenvError
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.kill import kill
from aenv.orchestrator.ops.pause import pause

log = logging.getLogger("aenv.orchestrator.ttl")

#: A kill still unfinished this long after it began failed half-way: try it again.
KILL_RETRY_S = 30.0


async def expire_once(node: Node) -> list[str]:
    """Pause or kill every running sandbox whose end time has passed, and finish kills that
    failed (e.g. a timed-out nft call on an overloaded node); returns their ids. A sandbox
    another operation holds is skipped and looked at again on the next pass."""
    now = node.clock()
    stuck = [r for r in await node.store.list([SandboxState.KILLING])
             if now - r.state_changed_at > KILL_RETRY_S
             and node.owners.kill_in_flight(r.sandbox_id) is None]
    expired = [r for r in await node.store.expired(now) if not node.owners.busy(r.sandbox_id)]
    expired += stuck
    ids = [r.sandbox_id for r in expired]
    results = await asyncio.gather(
        *((pause(node, r.sandbox_id, memory=r.auto_pause_memory, wait=0)
           if r.auto_pause and r.state == SandboxState.RUNNING
           else kill(node, r.sandbox_id, reason=None if r.state == SandboxState.KILLING
                     else "its timeout expired"))
          for r in expired),
        return_exceptions=True,
    )
    for sandbox_id, result in zip(ids, results, strict=True):
        if isinstance(result, AenvError):
            log.info("expiry of %s deferred: %s", sandbox_id, result.message)
        elif isinstance(result, BaseException):
            log.error("expiry of %s failed", sandbox_id, exc_info=result)
    return ids


async def run_ttl_loop(node: Node) -> None:
    failures = 0
    while True:
        try:
            await expire_once(node)
            failures = 0
        except Exception:
            failures += 1
            log.exception("the TTL pass failed (%d in a row)", failures)
        await asyncio.sleep(min(node.settings.ttl_check_interval_s * 2 ** failures, 30.0))
