"""Each team's metrics over time (E2B's ``GET /teams/{id}/metrics`` and ``/metrics/max``;
docs/metrics.md): how many of its sandboxes were up (``concurrentSandboxes``) and how many it
started per second (``sandboxStartRate``: creates, fork children, resumes).

Every ``SAMPLE_S`` seconds, at a whole multiple of it on the wall clock (so that the nodes of a
cluster sample at the same instants and a gateway can add their series point by point), one
pass counts each team's sandboxes up in the store and takes the starts counted since the last
pass (``started``, called as a start succeeds). A team with nothing up and nothing started is
not written, but for one zero sample after it had some; a read fills the gaps with zeros. A
long interval is read in coarser steps (at most ``MAX_POINTS`` points): the most sandboxes up
in a step, and its starts per second over the whole step. Samples are kept ``keep_s``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aenv.core.errors import InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator.team_quota import usage_by_team
from aenv.store.sqlite import Store
from aenv.store.team_samples import TeamSample, TeamSampleStore

log = logging.getLogger("aenv.orchestrator.team_metrics")

SAMPLE_S = 5
#: Steps an answer spans at most (one point more than that): a longer interval is read in
#: steps of several samples.
MAX_POINTS = 720
#: The interval read when none is given: the last hour.
DEFAULT_SPAN_S = 3600


@dataclass(frozen=True)
class Point:
    """One step of a team's series: its start (Unix seconds), the most sandboxes up in it and
    the starts per second over it."""

    at: int
    concurrent: int
    start_rate: float


def interval(start: int | None, end: int | None, now: float) -> tuple[int, int, int]:
    """(start, end, step) of a request's interval: end defaults to now, start to an hour
    before it; both rounded down to a sample; the step a multiple of the sample period that
    keeps the points within ``MAX_POINTS``. ``InvalidArgument`` when start is after end."""
    last = int(now // SAMPLE_S * SAMPLE_S)
    stop = min(int(end // SAMPLE_S * SAMPLE_S), last) if end is not None else last
    first = int(start // SAMPLE_S * SAMPLE_S) if start is not None \
        else stop - DEFAULT_SPAN_S
    if first > stop:
        raise InvalidArgument("start must not be after end")
    step = SAMPLE_S * max(1, math.ceil((stop - first) / SAMPLE_S / MAX_POINTS))
    return first, stop, step


def series(samples: list[TeamSample], first: int, stop: int, step: int) -> list[Point]:
    """``samples`` (one team's, in time order) as points of ``step`` from ``first`` to
    ``stop``, zeros where there are none."""
    concurrent: dict[int, int] = {}
    starts: Counter[int] = Counter()
    for s in samples:
        bucket = first + (s.at - first) // step * step
        concurrent[bucket] = max(concurrent.get(bucket, 0), s.concurrent)
        starts[bucket] += s.starts
    return [Point(at, concurrent.get(at, 0), round(starts[at] / step, 6))
            for at in range(first, stop + 1, step)]


class TeamMeter:
    """``default_team``: the team of a sandbox whose record names none."""

    def __init__(self, store: Store, samples: TeamSampleStore,
                 default_team: Callable[[], str], *, keep_s: float = 7 * 86_400.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.samples = samples
        self.default_team = default_team
        self.keep_s = keep_s
        self.clock = clock
        self._starts: Counter[str] = Counter()
        self._had: set[str] = set()

    def started(self, team: str, count: int) -> None:
        self._starts[team] += count

    async def sample(self) -> None:
        """One pass: every team's sandboxes up now and starts since the last pass."""
        at = int(self.clock() // SAMPLE_S * SAMPLE_S)
        records = await self.store.list(list(SandboxState))
        up = {team: used.count for team, used in
              usage_by_team(records, self.default_team()).items() if used.count}
        starts, self._starts = self._starts, Counter()
        taken = [TeamSample(team, at, up.get(team, 0), starts[team])
                 for team in sorted(set(up) | set(starts) | self._had)]
        try:
            await self.samples.append(taken)
        except BaseException:
            self._starts.update(starts)  # counted in the next pass
            raise
        self._had = {s.team_id for s in taken if s.concurrent or s.starts}

    async def points(self, team: str, start: int | None, end: int | None) -> list[Point]:
        first, stop, step = interval(start, end, self.clock())
        return series(await self.samples.between(team, first, stop + step - SAMPLE_S),
                      first, stop, step)

    async def run(self) -> None:
        """The sampling loop (one owner: the supervisor)."""
        pruned = 0.0
        while True:
            now = self.clock()
            await asyncio.sleep(SAMPLE_S - now % SAMPLE_S + 0.05)
            try:
                await self.sample()
                if self.clock() - pruned > 3600:
                    pruned = self.clock()
                    await self.samples.drop_before(int(pruned - self.keep_s))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("team metrics: a sample failed; the next one retries")
