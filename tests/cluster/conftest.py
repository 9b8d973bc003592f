from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from tests.redis_server import RedisServer, run_redis


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """One per test module: a module's nodes (or its wipe of Redis) never reach another's."""
    with run_redis() as server:
        yield server


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def keys() -> Keys:
    """A key prefix of the test's own: tests share one Redis server."""
    return Keys(prefix=f"t-{secrets.token_hex(4)}")
