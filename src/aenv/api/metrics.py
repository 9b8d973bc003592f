"""E2B's fleet metrics routes (docs/metrics.md): many sandboxes' usage at once, and a team's
sandboxes up and starts over time.

``GET /sandboxes/metrics?sandbox_ids=a,b`` → ``{"sandboxes": {<id>: SandboxMetric}}``: a
live sample of each running sandbox named that is the caller's (at most 100 ids, no id twice:
else 400); a paused, unknown or another team's sandbox is left out, as is one whose envd does
not answer within ``SAMPLE_TIMEOUT_S``.

``GET /teams/{id}/metrics?start=&end=`` → ``[TeamMetric]`` (``orchestrator/team_metrics.py``:
one point per step, zeros included) and ``GET /teams/{id}/metrics/max?start=&end=&metric=
concurrent_sandboxes|sandbox_start_rate`` → ``MaxTeamMetric`` (the first point with the
highest value). ``start`` and ``end`` are Unix seconds; a team reads its own (the operator
any): another team's answers 403, an unknown team 404.
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from aenv.api.auth import CallerDep
from aenv.api.convert import iso, metric_out
from aenv.api.node import NodeDep
from aenv.api.schemas import SandboxMetric
from aenv.core.errors import AenvError, InvalidArgument, PermissionDenied
from aenv.core.ids import is_sandbox_id
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops import metrics
from aenv.orchestrator.team_metrics import Point
from aenv.orchestrator.tenancy import Caller

router = APIRouter()

#: Ids one batch request may name (E2B's ``maxItems``).
MAX_IDS = 100
#: Samples taken at once for one batch request.
SAMPLE_CONCURRENCY = 16
#: A sandbox whose envd does not answer within this is left out of a batch.
SAMPLE_TIMEOUT_S = 5.0


class SandboxesWithMetrics(BaseModel):
    sandboxes: dict[str, SandboxMetric]


class TeamMetric(BaseModel):
    timestamp: str
    timestampUnix: int
    concurrentSandboxes: int
    sandboxStartRate: float


class MaxMetric(StrEnum):
    concurrent_sandboxes = "concurrent_sandboxes"
    sandbox_start_rate = "sandbox_start_rate"


class MaxTeamMetric(BaseModel):
    timestamp: str
    timestampUnix: int
    value: float


def sandbox_ids(raw: str) -> list[str]:
    """``sandbox_ids`` as E2B takes it (comma-separated, ≤ 100, no id twice)."""
    ids = [part.strip() for part in raw.split(",") if part.strip()]
    if not ids:
        raise InvalidArgument("sandbox_ids must name at least one sandbox")
    if len(ids) > MAX_IDS:
        raise InvalidArgument(f"sandbox_ids names at most {MAX_IDS} sandboxes")
    if len(set(ids)) != len(ids):
        raise InvalidArgument("sandbox_ids names a sandbox twice")
    return ids


@router.get("/sandboxes/metrics", response_model=SandboxesWithMetrics)
async def sandboxes_metrics(node: NodeDep, caller: CallerDep,
                            sandbox_ids_: Annotated[str, Query(alias="sandbox_ids")]
                            ) -> SandboxesWithMetrics:
    ids = sandbox_ids(sandbox_ids_)
    gate = asyncio.Semaphore(SAMPLE_CONCURRENCY)

    async def one(sandbox_id: str) -> tuple[str, SandboxMetric] | None:
        if not is_sandbox_id(sandbox_id):
            return None
        record = await node.store.get(sandbox_id)
        if record is None or not node.tenancy.is_team(caller, record.team_id):
            return None
        async with gate:
            with contextlib.suppress(AenvError, TimeoutError, OSError):
                async with asyncio.timeout(SAMPLE_TIMEOUT_S):
                    sample = await metrics.sample(node, sandbox_id)
                return (sandbox_id, metric_out(sample)) if sample is not None else None
        return None

    found = await asyncio.gather(*(one(i) for i in ids))
    return SandboxesWithMetrics(sandboxes=dict(f for f in found if f is not None))


async def _points(node: Node, caller: Caller, team_id: str, start: int | None,
                  end: int | None) -> list[Point]:
    if not caller.operator and team_id != caller.team_id:
        raise PermissionDenied("a team's key reads its own team's metrics only")
    await node.tenancy.team(team_id)  # NotFound (404) for a team that does not exist
    return await node.team_meter.points(team_id, start, end)


@router.get("/teams/{team_id}/metrics", response_model=list[TeamMetric])
async def team_metrics(team_id: str, node: NodeDep, caller: CallerDep,
                       start: Annotated[int | None, Query(ge=0)] = None,
                       end: Annotated[int | None, Query(ge=0)] = None) -> list[TeamMetric]:
    return [TeamMetric(timestamp=iso(p.at, "seconds"), timestampUnix=p.at,
                       concurrentSandboxes=p.concurrent, sandboxStartRate=p.start_rate)
            for p in await _points(node, caller, team_id, start, end)]


@router.get("/teams/{team_id}/metrics/max", response_model=MaxTeamMetric)
async def team_metrics_max(team_id: str, node: NodeDep, caller: CallerDep,
                           metric: MaxMetric,
                           start: Annotated[int | None, Query(ge=0)] = None,
                           end: Annotated[int | None, Query(ge=0)] = None) -> MaxTeamMetric:
    points = await _points(node, caller, team_id, start, end)

    def value(p: Point) -> float:
        return p.concurrent if metric is MaxMetric.concurrent_sandboxes else p.start_rate

    top = max(points, key=value)  # the first of the highest: max keeps the first
    return MaxTeamMetric(timestamp=iso(top.at, "seconds"), timestampUnix=top.at, value=value(top))
