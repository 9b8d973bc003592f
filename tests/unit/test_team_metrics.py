"""A team's metrics over time (``orchestrator/team_metrics.py``) on a real SQLite store: the
sample pass counts sandboxes up per team and the starts since the last pass, writes one zero
after a team had some, and a read gives points of a step that keeps them few, zeros filling
the gaps; an interval's bounds and a start after its end."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.core.errors import InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator.team_metrics import MAX_POINTS, SAMPLE_S, Point, TeamMeter, interval
from aenv.store.models import SandboxRecord
from aenv.store.sqlite import Store
from aenv.store.team_samples import TeamSampleStore

pytestmark = pytest.mark.anyio


def _record(n: int, team: str | None, state: SandboxState = SandboxState.RUNNING
            ) -> SandboxRecord:
    return SandboxRecord(sandbox_id=f"s{n}", template_id="base", state=state, version=1,
                         created_at=0, started_at=0, end_at=0, cpu_count=1, memory_mb=512,
                         disk_size_mb=1024, envd_token="t", client_id="c", team_id=team)


async def test_samples_count_what_is_up_and_started_and_read_back_as_points(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    now = [1_000_000.0]
    meter = TeamMeter(store, TeamSampleStore(store.db), lambda: "default",
                      clock=lambda: now[0])
    for n, (team, state) in enumerate([("a", SandboxState.RUNNING), ("a", SandboxState.PAUSED),
                                       ("a", SandboxState.RESUMING), (None, SandboxState.RUNNING),
                                       ("b", SandboxState.CREATING)]):
        await store.insert(_record(n, team, state))
    meter.started("a", 3)
    await meter.sample()
    now[0] += SAMPLE_S
    await store.delete(await store.require("s0"))
    await store.delete(await store.require("s2"))
    await meter.sample()  # a: nothing up, nothing started: one zero written
    now[0] += 3 * SAMPLE_S
    await meter.sample()  # and no more
    start = int(1_000_000 - SAMPLE_S)
    points = await meter.points("a", start, int(now[0]))
    assert points == [Point(start, 0, 0.0), Point(1_000_000, 2, 0.6),
                      Point(1_000_000 + SAMPLE_S, 0, 0.0),
                      *(Point(1_000_000 + k * SAMPLE_S, 0, 0.0) for k in (2, 3, 4))]
    assert [p.concurrent for p in await meter.points("default", start, int(now[0]))][:2] \
        == [0, 1]
    assert await meter.samples.between("a", 0, 2_000_000) == \
        (await meter.samples.between("a", 1_000_000, 1_000_000 + SAMPLE_S))
    # A week is read in steps: few points, the most up in each, the rate over the step.
    week = await meter.points("a", int(now[0]) - 7 * 86_400, int(now[0]))
    assert len(week) <= MAX_POINTS + 1
    assert max(p.concurrent for p in week) == 2
    step = week[1].at - week[0].at
    assert sum(p.start_rate for p in week) * step == pytest.approx(3, rel=0.01)
    await store.close()


def test_an_interval_defaults_to_the_last_hour_and_refuses_a_start_after_its_end() -> None:
    first, stop, step = interval(None, None, now=10_002.0)
    assert (first, stop, step) == (10_000 - 3600, 10_000, SAMPLE_S)
    assert interval(None, 99_999_999, now=10_002.0)[1] == 10_000  # never past now
    with pytest.raises(InvalidArgument):
        interval(9_000, 8_000, now=10_002.0)
