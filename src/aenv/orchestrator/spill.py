"""The spiller: writes frozen (hot-paused) sandboxes to disk once they have been paused for
``pause_hot_s``, or at once when more than ``max_hot_paused`` are frozen (oldest first).

One loop of the node's supervisor; a spill that fails is retried later (the sandbox stays frozen and
paused meanwhile, so nothing is lost). After a restart, ``adopt`` re-schedules every frozen
sandbox recovery found.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aenv.core.errors import AenvError, Conflict, FailedPrecondition, NotFound
from aenv.core.settings import Settings
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.pause import spill

log = logging.getLogger("aenv.orchestrator.spill")

#: After a failed spill, that sandbox is tried again this much later, doubling per failure
#: up to ``RETRY_MAX_S``; a spill skipped because another operation held the sandbox is tried
#: again after ``BUSY_RETRY_S``.
RETRY_S = 2.0
RETRY_MAX_S = 60.0
BUSY_RETRY_S = 1.0


class Spiller:
    """Schedules are kept from construction on; spills begin
    once :meth:`start` hands it the node (recovery schedules before that)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._node: Node | None = None
        #: sandbox id → monotonic time it is due.
        self._due: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._running: set[asyncio.Task[object]] = set()
        #: sandbox id → failed spills in a row (for the backoff).
        self._failures: dict[str, int] = {}
        #: Checkpoints share the node's few cores: a bounded number write at once, and a
        #: spill waiting here holds no sandbox (``max_concurrent_spills``).
        self._writers = asyncio.Semaphore(settings.max_concurrent_spills)

    def schedule(self, sandbox_id: str, *, delay: float | None = None) -> None:
        hot = self._settings.pause_hot_s if delay is None else delay
        self._due[sandbox_id] = time.monotonic() + hot
        overflow = len(self._due) - self._settings.max_hot_paused
        if overflow > 0:
            for oldest in sorted(self._due, key=self._due.__getitem__)[:overflow]:
                self._due[oldest] = 0.0
        self._wake.set()

    def cancel(self, sandbox_id: str) -> None:
        self._due.pop(sandbox_id, None)
        self._failures.pop(sandbox_id, None)

    @property
    def pending(self) -> int:
        return len(self._due)

    async def start(self, node: Node) -> None:
        self._node = node
        node.supervisor.spawn("spiller", self._loop)

    async def close(self) -> None:
        """After the supervisor stopped the loop: an in-flight spill is shielded and
        finishes on its own; wait for it briefly."""
        if self._running:
            await asyncio.wait(self._running, timeout=30)

    async def drain(self) -> None:
        """Spill every frozen sandbox now (benchmarks, shutdown of a node being drained)."""
        for sandbox_id in list(self._due):
            self._due.pop(sandbox_id, None)
            await self._spill(sandbox_id)

    async def _loop(self) -> None:
        while True:
            now = time.monotonic()
            due = [sid for sid, at in self._due.items() if at <= now]
            for sandbox_id in due:
                del self._due[sandbox_id]
                task = asyncio.create_task(self._spill(sandbox_id), name=f"spill-{sandbox_id}")
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            self._wake.clear()
            wait = min(self._due.values(), default=now + 3600) - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()

    async def _spill(self, sandbox_id: str) -> None:
        node = self._node
        if node is None:
            raise FailedPrecondition("the spiller has not started")
        try:
            async with self._writers:
                if sandbox_id in self._due:  # re-scheduled (or cancelled) while it waited
                    return
                spilled = await spill(node, sandbox_id)
            if spilled is not None:
                # Outside the writers' turn: a create is no checkpoint.
                await node.resume_ready.offer(sandbox_id)
        except Conflict as exc:
            if node.owners.killed(sandbox_id):
                return
            # Another operation holds it (a resume, a kill...): look again soon; a spill
            # that finds it no longer frozen does nothing.
            log.debug("spill of %s deferred: %s", sandbox_id, exc.message)
            self.schedule(sandbox_id, delay=BUSY_RETRY_S)
            return
        except NotFound:
            self._failures.pop(sandbox_id, None)
            return
        except Exception as exc:
            failures = self._failures[sandbox_id] = self._failures.get(sandbox_id, 0) + 1
            delay = min(RETRY_S * 2 ** (failures - 1), RETRY_MAX_S)
            message = getattr(exc, "message", None) or repr(exc)
            log.warning("writing paused sandbox %s to disk failed (attempt %d); it stays "
                        "paused in memory, next try in %.0f s: %s", sandbox_id, failures,
                        delay, message, exc_info=not isinstance(exc, AenvError))
            self.schedule(sandbox_id, delay=delay)
            return
        self._failures.pop(sandbox_id, None)
