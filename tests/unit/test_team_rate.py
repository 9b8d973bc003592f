"""A team's starts per second across the cluster (cluster/team_rate.py), against a real Redis:
two gateways' counters are one, the last start goes to exactly one of them, a fork larger
than a second's worth is refused whole, and the next second starts afresh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.team_rate import TeamRate
from tests.redis_server import RedisServer, run_redis

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with run_redis() as running:
        yield running


@pytest.fixture
async def gateways(server: RedisServer) -> AsyncIterator[tuple[TeamRate, TeamRate]]:
    one, two = (Redis.from_url(server.url, decode_responses=True) for _ in range(2))
    keys = Keys(prefix="rate-test")
    yield TeamRate(one, keys), TeamRate(two, keys)
    await one.aclose()
    await two.aclose()


async def _start_of_a_second(redis: Redis) -> None:
    """Wait until Redis's clock is early in a second, so a burst falls in one window."""
    while True:
        _, micros = await redis.time()
        if micros < 200_000:
            return
        await asyncio.sleep((1_000_000 - micros) / 1e6 + 0.01)


async def test_two_gateways_share_one_count(gateways: tuple[TeamRate, TeamRate]) -> None:
    one, two = gateways
    await _start_of_a_second(one._redis)
    taken = await asyncio.gather(*(g.take("team-a", 5.0) for g in (one, two) * 20))
    assert sum(taken) == 5
    assert await one.take("team-b", 5.0)  # another team has its own
    await asyncio.sleep(1.0)
    assert await two.take("team-a", 5.0)  # a new second


async def test_a_fork_is_taken_whole_or_not_at_all(gateways: tuple[TeamRate, TeamRate]) -> None:
    one, _ = gateways
    await _start_of_a_second(one._redis)
    assert not await one.take("team-f", 2.5, count=4)  # more than a second's worth (3)
    assert await one.take("team-f", 2.5, count=3)
    assert not await one.take("team-f", 2.5, count=1)
    # At least one a second, whatever the rate.
    assert await one.take("team-slow", 0.1)
