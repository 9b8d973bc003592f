"""The team quota gate (orchestrator/team_quota.py): reservations, the re-read when a start
finishes during a read of the store, the starts-per-second bucket, and bad quotas."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aenv.core.errors import InvalidArgument, ResourceExhausted
from aenv.core.states import SandboxState
from aenv.orchestrator.team_quota import Quota, QuotaGate
from aenv.store.models import SandboxRecord

pytestmark = pytest.mark.anyio


def _record(n: int, state: SandboxState = SandboxState.RUNNING) -> SandboxRecord:
    return SandboxRecord(sandbox_id=f"s{n}", template_id="base", state=state, version=1,
                         created_at=0, started_at=0, end_at=0, cpu_count=1, memory_mb=512,
                         disk_size_mb=1024, envd_token="t", client_id="c")


async def test_a_start_that_finishes_during_a_read_is_counted_once() -> None:
    gate = QuotaGate()
    quota = Quota(max_sandboxes=2)
    store: list[SandboxRecord] = []
    first_in = asyncio.Event()
    finish_first = asyncio.Event()

    async def first() -> None:
        async def records() -> list[SandboxRecord]:
            return list(store)
        async with gate.admit(quota, "t", records, count=1, memory_mb=512, disk_mb=0):
            first_in.set()
            await finish_first.wait()
            store.append(_record(1))  # its record is written, then its reservation dropped

    reads = 0

    async def racing_records() -> list[SandboxRecord]:
        # The read sees the store before the first start's record; the first start then
        # finishes (record written, reservation dropped) before the read returns.
        nonlocal reads
        reads += 1
        seen = list(store)
        if reads == 1:
            finish_first.set()
            await asyncio.sleep(0.01)
        return seen

    task = asyncio.create_task(first())
    await first_in.wait()
    async with gate.admit(quota, "t", racing_records, count=1, memory_mb=512, disk_mb=0):
        store.append(_record(2))
    await task
    assert reads == 2  # read again: the first start was neither a record nor a reservation
    with pytest.raises(ResourceExhausted, match="quota of 2 running"):
        async with gate.admit(quota, "t", racing_records, count=1, memory_mb=512, disk_mb=0):
            pass


async def test_paused_sandboxes_hold_disk_not_a_running_slot() -> None:
    gate = QuotaGate()
    paused = [_record(n, SandboxState.PAUSED) for n in range(3)]

    async def records() -> list[Any]:
        return paused
    async with gate.admit(Quota(max_sandboxes=1), "t", records, count=1, memory_mb=512,
                          disk_mb=1024):
        pass
    with pytest.raises(ResourceExhausted, match="MB of disk") as refused:
        async with gate.admit(Quota(max_disk_mb=3 * 1024), "t", records, count=1,
                              memory_mb=512, disk_mb=1024):
            pass
    assert refused.value.retry_after_s == 5


async def test_the_starts_bucket_refills_and_a_refusal_costs_nothing() -> None:
    now = [100.0]
    gate = QuotaGate(clock=lambda: now[0])
    quota = Quota(starts_per_s=2, max_sandboxes=1)

    async def none() -> list[Any]:
        return []

    async def full() -> list[Any]:
        return [_record(1)]
    for _ in range(2):
        async with gate.admit(quota, "t", none, count=1, memory_mb=1, disk_mb=0):
            pass
    with pytest.raises(ResourceExhausted, match="per second") as refused:
        async with gate.admit(quota, "t", none, count=1, memory_mb=1, disk_mb=0):
            pass
    assert refused.value.retry_after_s == 1
    now[0] += 0.5
    with pytest.raises(ResourceExhausted, match="running"):  # refused: its token comes back
        async with gate.admit(quota, "t", full, count=1, memory_mb=1, disk_mb=0):
            pass
    async with gate.admit(quota, "t", none, count=1, memory_mb=1, disk_mb=0):
        pass


def test_a_quota_is_positive_numbers_or_nothing() -> None:
    assert Quota.from_json({}).unlimited
    assert Quota.from_json({"maxSandboxes": 4}).as_json()["maxSandboxes"] == 4
    for bad in ({"maxSandboxes": 0}, {"maxMemoryMB": -1}, {"startsPerSecond": "x"},
                {"maxDiskMB": True}):
        with pytest.raises(InvalidArgument):
            Quota.from_json(bad)
