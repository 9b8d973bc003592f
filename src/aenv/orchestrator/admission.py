"""Admission of sandbox starts: a few run at once, a few more wait, the rest are refused at once.

A start (a restore from a memory image, or a boot) costs about 0.3 s of CPU. A hundred creates
let through at once on two cores make every one of them take tens of seconds, past the clients'
timeouts, and slow everything else the node does. So at most ``max_starts`` run at a time, at
most ``max_waiting`` more wait in line (first come, first served), and a create beyond both is
refused with ``ResourceExhausted`` (429) carrying ``retry_after_s``, which the API sends as
``Retry-After``; the E2B SDKs retry a 429 after that many seconds, up to three times.

The node's sandbox limit is checked here too, under one lock, once a create holds its start:
two creates checked at once would both see the last free place.

Owns: its counters and the waiters' futures. Waiting is an await on a future, never a poll,
so the event loop serves other requests (``/health``) meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from aenv.core import telemetry
from aenv.core.errors import ResourceExhausted

#: ``fits(starting)`` raises ``ResourceExhausted`` when the node cannot take one more sandbox,
#: counting ``starting`` admitted creates whose records may not be stored yet.
Fits = Callable[[int], Awaitable[object]]


class Admission:
    """At most ``max_starts`` sandbox starts in progress, at most ``max_waiting`` waiting."""

    def __init__(self, *, max_starts: int, max_waiting: int, retry_after_s: int = 1) -> None:
        if max_starts < 1 or max_waiting < 0 or retry_after_s < 1:
            raise ValueError("need max_starts >= 1, max_waiting >= 0, retry_after_s >= 1")
        self.max_starts = max_starts
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self._running = 0
        #: Waiters in arrival order; a waiter's future is resolved when a start is handed to it.
        self._queue: deque[asyncio.Future[None]] = deque()
        #: Creates past the sandbox-limit check and not finished yet.
        self._admitted = 0
        self._check = asyncio.Lock()

    @classmethod
    def unlimited(cls) -> Admission:
        """No bound on starts (a node built without settings for it); the sandbox-limit check
        still runs under the lock."""
        return cls(max_starts=sys.maxsize, max_waiting=0)

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._queue if not waiter.done())

    @contextlib.asynccontextmanager
    async def start(self, fits: Fits | None = None) -> AsyncIterator[None]:
        """Inside: one of the node's starts is this caller's.

        Prerequisites: none.
        On success: entered at once when a start is free and nobody waits, else after the
        waiters before it; then ``fits`` (if given) passed. The start is given back on exit.
        On failure: ``ResourceExhausted`` with ``retry_after_s`` at once when ``max_waiting``
        already wait, or when ``fits`` raised it; nothing is held. A waiter cancelled (its client
        went away) leaves the line and hands on a start it was just given.
        """
        await self._acquire()
        try:
            async with self._check:
                if fits is not None:
                    try:
                        await fits(self._admitted)
                    except ResourceExhausted as exc:
                        if exc.retry_after_s is None:
                            exc.retry_after_s = self.retry_after_s
                        raise
                self._admitted += 1
            try:
                yield
            finally:
                self._admitted -= 1
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self._running < self.max_starts and not self.waiting:
            self._running += 1
            return
        if self.waiting >= self.max_waiting:
            telemetry.REFUSALS.labels(reason="queue_full").inc()
            raise ResourceExhausted(
                f"this node is starting {self._running} sandboxes and {self.waiting} more wait;"
                f" retry in {self.retry_after_s} s",
                retry_after_s=self.retry_after_s,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a start, then cancelled before it could use it
            else:
                with contextlib.suppress(ValueError):
                    self._queue.remove(waiter)
            raise

    def _release(self) -> None:
        # The start passes straight to the first live waiter, so a newcomer cannot jump the line.
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._running -= 1
