"""The node's ``Idempotency-Key`` memory (``aenv.api.idempotency.IdempotencyKeys``): one
create per key while it runs and after, failures forgotten, expiry, the size bound."""

from __future__ import annotations

import asyncio

import pytest

from aenv.api.idempotency import IdempotencyKeys
from aenv.core.errors import Conflict, ResourceExhausted

pytestmark = pytest.mark.anyio


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_repeats_share_one_create() -> None:
    keys: IdempotencyKeys[str] = IdempotencyKeys(3600)
    started, release = [], asyncio.Event()

    async def create() -> str:
        started.append(1)
        await release.wait()
        return f"sandbox-{len(started)}"

    waiting = [asyncio.ensure_future(keys.run("tenant", "k", "body", create)) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*waiting) == ["sandbox-1"] * 5
    assert started == [1]
    assert await keys.run("tenant", "k", "body", create) == "sandbox-1"  # replayed after
    assert await keys.run("other-tenant", "k", "body", create) == "sandbox-2"


async def test_the_first_request_going_away_leaves_the_create_running() -> None:
    keys: IdempotencyKeys[str] = IdempotencyKeys(3600)
    release = asyncio.Event()

    async def create() -> str:
        await release.wait()
        return "sandbox"

    first = asyncio.ensure_future(keys.run("t", "k", "b", create))
    await asyncio.sleep(0.01)
    first.cancel()
    release.set()
    assert await keys.run("t", "k", "b", create) == "sandbox"


async def test_a_failed_create_is_forgotten_and_other_bodies_refused() -> None:
    keys: IdempotencyKeys[str] = IdempotencyKeys(3600)
    answers: list[object] = [ResourceExhausted("busy", retry_after_s=1), "sandbox"]

    async def create() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    with pytest.raises(ResourceExhausted):
        await keys.run("t", "k", "b", create)
    assert await keys.run("t", "k", "b", create) == "sandbox"
    with pytest.raises(Conflict, match="different request"):
        await keys.run("t", "k", "another body", create)


async def test_keys_expire_and_the_map_is_bounded() -> None:
    clock = Clock()
    keys: IdempotencyKeys[int] = IdempotencyKeys(60, max_keys=3, clock=clock)
    count = 0

    async def create() -> int:
        nonlocal count
        count += 1
        return count

    assert await keys.run("t", "k", "b", create) == 1
    clock.now = 59
    assert await keys.run("t", "k", "b", create) == 1
    clock.now = 61
    assert await keys.run("t", "k", "b", create) == 2  # expired: a new create
    for i in range(10):
        await keys.run("t", f"other-{i}", "b", create)
    assert len(keys) == 3
