"""How many sandboxes the node was asked for at once lately: the pre-created pool's size.

A fixed pool either holds memory and slots for the largest fork it will ever see, or leaves
most of a large fork cold. So the pool keeps ``floor`` sandboxes (``precreate_pool_size``)
and grows to the largest *demand* of the last ``window_s`` (``precreate_demand_window_s``),
up to ``ceiling`` (``precreate_pool_max``). A demand is the sandboxes asked for within
``BURST_S`` of each other that may restore into a pre-created one, counted as they arrive
(admission then spreads their starts out): a fork of 20 children is one of 20, a fan-out of
creates from one snapshot counts together. Past the window a demand is forgotten, and the
pool shrinks back to what the remaining ones ask for.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

#: Requests at most this far apart count as one demand (a fork's children arrive at once;
#: a client's fan-out of creates within a second).
BURST_S = 1.0


class Demand:
    def __init__(self, *, floor: int, ceiling: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.floor = floor
        self.ceiling = max(floor, ceiling)
        self.window_s = window_s
        self._clock = clock
        #: (when, how many) of each request, oldest first, none older than the window.
        self._asked: deque[tuple[float, int]] = deque()

    def record(self, count: int = 1) -> None:
        """``count`` sandboxes were looked for now."""
        self._asked.append((self._clock(), count))
        self._forget()

    def target(self) -> int:
        """How many the pool should hold now: the largest demand of the window, bounded."""
        self._forget()
        peak, first, in_burst = 0, 0, 0
        asked = list(self._asked)
        for when, count in asked:
            in_burst += count
            while asked[first][0] < when - BURST_S:
                in_burst -= asked[first][1]
                first += 1
            peak = max(peak, in_burst)
        return max(self.floor, min(self.ceiling, peak))

    def changes_in(self) -> float | None:
        """Seconds until the oldest remembered request leaves the window (the target may
        then shrink), or None when nothing is remembered."""
        self._forget()
        if not self._asked:
            return None
        return max(0.0, self._asked[0][0] + self.window_s - self._clock())

    def _forget(self) -> None:
        horizon = self._clock() - self.window_s
        while self._asked and self._asked[0][0] <= horizon:
            self._asked.popleft()
