"""The admission of sandbox starts: bounded running, bounded waiting, first come first served,
refusals with a retry hint, cancelled waiters leave no trace, and the limit check is serialised."""

from __future__ import annotations

import asyncio

import pytest

from aenv.core.errors import ResourceExhausted
from aenv.orchestrator.admission import Admission

pytestmark = pytest.mark.anyio


async def _hold(admission: Admission, release: asyncio.Event, log: list[int], n: int) -> None:
    async with admission.start():
        log.append(n)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_runs_at_most_max_starts_queues_max_waiting_refuses_the_rest() -> None:
    admission = Admission(max_starts=2, max_waiting=3, retry_after_s=2)
    release = asyncio.Event()
    entered: list[int] = []
    tasks = [asyncio.create_task(_hold(admission, release, entered, n)) for n in range(5)]
    await _settle()
    assert entered == [0, 1]
    assert (admission.running, admission.waiting) == (2, 3)

    with pytest.raises(ResourceExhausted) as refused:
        async with admission.start():
            pytest.fail("admitted beyond the queue")
    assert refused.value.http_status == 429
    assert refused.value.retry_after_s == 2

    release.set()
    await asyncio.gather(*tasks)
    assert entered == [0, 1, 2, 3, 4]  # the waiters in the order they came
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_newcomer_does_not_jump_the_line() -> None:
    admission = Admission(max_starts=1, max_waiting=2)
    first = asyncio.Event()
    order: list[str] = []

    async def one(name: str, gate: asyncio.Event | None) -> None:
        async with admission.start():
            order.append(name)
            if gate is not None:
                await gate.wait()

    holder = asyncio.create_task(one("holder", first))
    await _settle()
    waiter = asyncio.create_task(one("waiter", None))
    await _settle()
    first.set()
    # Released while "waiter" waits: the start is handed to it, not to a create arriving now.
    late = asyncio.create_task(one("late", None))
    await asyncio.gather(holder, waiter, late)
    assert order == ["holder", "waiter", "late"]


async def test_a_cancelled_waiter_leaves_the_line_and_the_count_returns_to_zero() -> None:
    admission = Admission(max_starts=1, max_waiting=1)
    release = asyncio.Event()
    entered: list[int] = []
    holder = asyncio.create_task(_hold(admission, release, entered, 0))
    await _settle()
    waiter = asyncio.create_task(_hold(admission, release, entered, 1))
    await _settle()
    assert admission.waiting == 1
    waiter.cancel()
    await _settle()
    assert admission.waiting == 0
    # Its place in the line is free again.
    again = asyncio.create_task(_hold(admission, release, entered, 2))
    await _settle()
    assert admission.waiting == 1
    release.set()
    await asyncio.gather(holder, again)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert entered == [0, 2]
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_waiter_cancelled_just_after_being_handed_a_start_passes_it_on() -> None:
    admission = Admission(max_starts=1, max_waiting=2)
    release = asyncio.Event()
    entered: list[int] = []
    handed: asyncio.Task[None] | None = None

    async def holder() -> None:
        async with admission.start():
            await release.wait()
        # In the same step as the exit that handed the start to "handed", before it ran.
        assert handed is not None
        handed.cancel()

    first = asyncio.create_task(holder())
    await _settle()
    handed = asyncio.create_task(_hold(admission, release, entered, 1))
    after = asyncio.create_task(_hold(admission, release, entered, 2))
    await _settle()
    release.set()
    await asyncio.gather(first, after)
    with pytest.raises(asyncio.CancelledError):
        await handed
    assert entered == [2]
    assert (admission.running, admission.waiting) == (0, 0)


async def test_the_limit_check_sees_the_admitted_ones_and_its_refusal_gets_the_retry_hint() -> None:
    admission = Admission(max_starts=3, max_waiting=0, retry_after_s=1)
    limit = 2
    release = asyncio.Event()
    seen: list[int] = []

    async def fits(starting: int) -> None:
        seen.append(starting)
        await asyncio.sleep(0.01)  # a store query: another check must not interleave
        if starting >= limit:
            raise ResourceExhausted("full")

    async def one() -> None:
        async with admission.start(fits):
            await release.wait()

    tasks = [asyncio.create_task(one()) for _ in range(3)]
    await asyncio.sleep(0.1)
    assert seen == [0, 1, 2]
    refused = tasks[2].exception()
    assert isinstance(refused, ResourceExhausted) and refused.retry_after_s == 1
    release.set()
    await asyncio.gather(*tasks[:2])
    assert (admission.running, admission.waiting) == (0, 0)


def test_settings_bounds() -> None:
    with pytest.raises(ValueError):
        Admission(max_starts=0, max_waiting=1)
    with pytest.raises(ValueError):
        Admission(max_starts=1, max_waiting=-1)
