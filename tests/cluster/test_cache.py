"""The gateway's cache of cluster state (``cluster/cache.py``) over a real Redis: heartbeats
read at most every ``nodes_ttl_s`` with Redis's clock carried forward, bindings kept until
their time is up, and a move by another writer found by its newer fencing token."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from aenv.cluster import bindings
from aenv.cluster.cache import ClusterCache
from aenv.cluster.keys import Keys
from tests.cluster.test_scheduler import beat

pytestmark = pytest.mark.anyio


async def test_heartbeats_are_read_again_only_after_their_time(redis: Redis, keys: Keys) -> None:
    cache = ClusterCache(redis, keys, nodes_ttl_s=0.3)
    await beat(redis, keys, "a")
    nodes, first_ms = await cache.nodes()
    assert [n.node_id for n in nodes] == ["a"]
    await beat(redis, keys, "b")
    await asyncio.sleep(0.1)
    nodes, second_ms = await cache.nodes()
    assert [n.node_id for n in nodes] == ["a"]  # cached
    assert 80 <= second_ms - first_ms <= 250  # the clock moves on between reads
    await asyncio.sleep(0.25)
    nodes, _ = await cache.nodes()
    assert sorted(n.node_id for n in nodes) == ["a", "b"]


async def test_a_binding_is_cached_and_a_move_elsewhere_is_found_by_its_token(
        redis: Redis, keys: Keys) -> None:
    cache = ClusterCache(redis, keys, binding_ttl_s=0.5)
    assert await cache.binding("s1") == (None, False)
    await bindings.bind(redis, keys, "s1", "a", 1)
    assert await cache.binding("s1") == (("a", 1), False)
    assert await cache.binding("s1") == (("a", 1), True)
    # Another gateway moves it: the cache still says a, until asked whether it moved.
    assert await bindings.bind(redis, keys, "s1", "b", 2)
    assert await cache.binding("s1") == (("a", 1), True)
    assert await cache.moved("s1", ("a", 1)) == ("b", 2)
    assert await cache.binding("s1") == (("b", 2), True)
    assert await cache.moved("s1", ("b", 2)) is None
    await bindings.unbind(redis, keys, "s1")
    await asyncio.sleep(0.5)
    assert await cache.binding("s1") == (None, False)


async def test_the_cache_keeps_at_most_its_bound(redis: Redis, keys: Keys,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aenv.cluster.cache.MAX_BINDINGS", 3)
    cache = ClusterCache(redis, keys)
    for i in range(5):
        cache.remember(f"s{i}", "a", 1)
    assert [await cache.binding(f"s{i}") for i in (3, 4)] == [(("a", 1), True)] * 2
    assert await cache.binding("s0") == (None, False)  # evicted: read again, not there
