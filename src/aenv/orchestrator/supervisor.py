"""One owner for every background loop of the node (trio's rule: no task without an owner).

The TTL, idle, liveness, GC, reaper and pool-trim loops, the spiller, the warm and pre-created
pools' refills, the death watch and the cluster heartbeat each run as one named loop here.
A loop handles the failures it expects itself (and logs them); one that escapes — a bug, a
store gone away — is logged here with the loop's name and traceback, and the loop is started
again after a backoff (``BACKOFF_S`` doubling to ``BACKOFF_MAX_S``; back to ``BACKOFF_S``
once a run has lasted ``HEALTHY_AFTER_S``), so one broken pass never silently stops the
node's housekeeping. A loop that returns is done (a pool of size 0 has nothing to fill).

States of a loop (``LoopHealth.state``): ``running``; ``backing-off`` (it failed, and starts
again at ``retry_at``); ``done`` (it returned); ``stopped`` (the node is shutting down).
:meth:`Supervisor.health` reports them (``GET /node/loops``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger("aenv.orchestrator.supervisor")

BACKOFF_S = 1.0
BACKOFF_MAX_S = 60.0
#: A run this long resets the backoff: the failure before it was not a crash loop.
HEALTHY_AFTER_S = 60.0
#: A loop still going this long after its cancel is named in a warning.
STOP_WARN_S = 3.0

LoopState = Literal["running", "backing-off", "done", "stopped"]


@dataclass
class LoopHealth:
    name: str
    state: LoopState = "running"
    #: Failures since the node started, and in a row (the backoff's exponent).
    failures: int = 0
    in_a_row: int = 0
    last_error: str | None = None
    #: Wall-clock seconds of the last failure, and of the next start while backing off.
    failed_at: float | None = None
    retry_at: float | None = None
    started_at: float = field(default_factory=time.time)


class Supervisor:
    def __init__(self, *, backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S,
                 healthy_after_s: float = HEALTHY_AFTER_S) -> None:
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._healthy_after_s = healthy_after_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._health: dict[str, LoopHealth] = {}
        self._closed = False

    def spawn(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop()`` until it returns, restarting it after each failure.
        Prerequisites: no loop of this name yet; the supervisor is not closed."""
        if self._closed:
            raise RuntimeError(f"supervisor closed: cannot start loop {name}")
        if name in self._tasks:
            raise ValueError(f"a loop named {name} runs already")
        self._health[name] = LoopHealth(name)
        self._tasks[name] = asyncio.create_task(self._supervise(name, loop), name=name)

    def health(self) -> list[LoopHealth]:
        return [self._health[name] for name in sorted(self._health)]

    async def close(self) -> None:
        """Cancel every loop and wait for them to end. Idempotent. A loop still going
        ``STOP_WARN_S`` after its cancel is named in a warning (a loop that outlives its cancel
        holds the node's shutdown), and still waited for."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            _, left = await asyncio.wait(tasks, timeout=STOP_WARN_S)
            if left:
                log.warning("background loops still going %g s after their cancel: %s",
                            STOP_WARN_S, ", ".join(sorted(t.get_name() for t in left)))
        await asyncio.gather(*tasks, return_exceptions=True)
        for health in self._health.values():
            if health.state != "done":
                health.state = "stopped"

    async def _supervise(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        health = self._health[name]
        while True:
            health.state, health.retry_at = "running", None
            started = time.monotonic()
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() - started >= self._healthy_after_s:
                    health.in_a_row = 0
                health.failures += 1
                health.in_a_row += 1
                health.last_error = f"{type(exc).__name__}: {exc}"[:500]
                health.failed_at = time.time()
                delay = min(self._backoff_s * 2 ** (health.in_a_row - 1), self._backoff_max_s)
                health.state, health.retry_at = "backing-off", time.time() + delay
                log.error("background loop %s failed (%d in a row, %d in all); restarting "
                          "in %.0f s", name, health.in_a_row, health.failures, delay,
                          exc_info=exc)
                await asyncio.sleep(delay)
            else:
                health.state = "done"
                log.info("background loop %s finished", name)
                return
