from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from tests.cluster.layout import Namespace, namespaces
from tests.redis_server import RedisServer, run_redis


@pytest.fixture(scope="module")
def hub() -> Iterator[tuple[str, list[Namespace]]]:
    """The host's hub address and three network namespaces for nodes of their own
    (``layout.py``); a module's Redis and S3 server listen on the hub address."""
    with namespaces(3) as made:
        yield made


@pytest.fixture(scope="module")
def redis_server(hub: tuple[str, list[Namespace]]) -> Iterator[RedisServer]:
    """One per test module: a module's nodes (or its wipe of Redis) never reach another's."""
    with run_redis(host=hub[0]) as server:
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
