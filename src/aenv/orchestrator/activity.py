"""When each sandbox last saw traffic, for the idle auto-pause (``orchestrator/idle.py``).

Touched by the proxy at the start and end of every request or stream to a sandbox and by
every API call naming one; an open stream counts as activity for its whole length through
``StreamRegistry.count`` (the idle loop asks both). In memory only, on the monotonic clock: a
restart starts every sandbox's idle time afresh, which only ever pauses later, never sooner.

The proxy touches on its hot path, so a touch is one dict write: no lock (one event loop), no
await.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection


class Activity:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}

    def touch(self, sandbox_id: str) -> None:
        self._last[sandbox_id] = self._clock()

    def idle_for(self, sandbox_id: str) -> float | None:
        """Seconds since the last touch; None if never touched (or forgotten)."""
        last = self._last.get(sandbox_id)
        return None if last is None else self._clock() - last

    def retain(self, sandbox_ids: Collection[str]) -> None:
        """Forget every sandbox not in ``sandbox_ids`` (gone, or not running: its idle time
        starts again when it runs)."""
        for sandbox_id in [s for s in self._last if s not in sandbox_ids]:
            del self._last[sandbox_id]
