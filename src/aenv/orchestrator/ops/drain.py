"""Drain: this node takes no new placements and hands every sandbox to the repository.

Steps, each observable: the node says ``draining`` in its heartbeats from the first moment
(``Node.drain``), so schedulers place nothing more here; every running sandbox is paused
with its memory and written to disk at once (no hot period); every paused one, those included,
is published to the shared repository (``paused_repo.py``), from where any node of the
cluster resumes it. The node itself keeps each sandbox paused until another node takes it
over (``paused_repo.moved_away``), so a drain that stops half-way loses nothing.

Returns what happened per sandbox: ``moved`` (published, running before: to be resumed
elsewhere), ``parked`` (published, paused before), ``failed`` (with the reason; it stays
here, paused or running).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aenv.core.errors import AenvError, FailedPrecondition
from aenv.core.states import SandboxState
from aenv.orchestrator import paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops import pause as pause_op

log = logging.getLogger("aenv.orchestrator.drain")

#: How long one sandbox may take from pause to published (a large memory image on S3).
PUBLISH_TIMEOUT_S = 300.0
POLL_S = 0.1


@dataclass
class Drained:
    moved: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


async def drain(node: Node) -> Drained:
    if not node.settings.cluster:
        raise FailedPrecondition("a drain hands sandboxes to the cluster's shared repository; "
                                 "this node is not in a cluster")
    node.drain.on = True
    done = Drained()
    records = await node.store.list([SandboxState.RUNNING, SandboxState.PAUSED])
    log.info("draining: %d sandboxes to hand over", len(records))

    async def one(sandbox_id: str, was_running: bool) -> None:
        try:
            if was_running:
                await pause_op.pause(node, sandbox_id)
            record = await node.store.get(sandbox_id)
            # A frozen one is written to disk now, not after its hot period; the spill
            # publishes it.
            if record is not None and not paused_repo.published(record):
                node.spiller.schedule(sandbox_id, delay=0)
            await _published(node, sandbox_id)
            (done.moved if was_running else done.parked).append(sandbox_id)
        except AenvError as exc:
            done.failed[sandbox_id] = exc.message
        except TimeoutError:
            done.failed[sandbox_id] = f"not published within {PUBLISH_TIMEOUT_S:.0f} s"

    await asyncio.gather(*(one(r.sandbox_id, r.state == SandboxState.RUNNING)
                           for r in records))
    log.info("drained: %d moved, %d parked, %d failed", len(done.moved), len(done.parked),
             len(done.failed))
    return done


async def _published(node: Node, sandbox_id: str) -> None:
    deadline = time.monotonic() + PUBLISH_TIMEOUT_S
    while True:
        record = await node.store.get(sandbox_id)
        if record is None or (record.state == SandboxState.PAUSED
                              and paused_repo.published(record)):
            return
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(POLL_S)
