"""The scheduler over a real Redis server: placement by score and locality, atomic
reservations under concurrent replicas, 429 when full, 503 when no node is reachable, and
health from heartbeat age. Nodes here are heartbeats written through ``registry.heartbeat``,
exactly what a node writes; the node processes themselves come in with the gateway tests."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from redis.asyncio import Redis

from aenv.cluster import registry, reserve
from aenv.cluster.keys import Keys
from aenv.cluster.model import NodeInfo
from aenv.cluster.scheduler import create_app
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio


async def beat(redis: Redis, keys: Keys, node_id: str, **fields: object) -> NodeInfo:
    info = NodeInfo(node_id=node_id, address=f"http://{node_id}:3000",
                    **{"limit": 10, "starting_limit": 10, **fields})  # type: ignore[arg-type]
    measured = await registry.now_ms(redis)
    await registry.heartbeat(redis, keys, info, roster=[], measured_ms=measured)
    return info


def scheduler(redis_server: RedisServer, keys: Keys, key_quota: int = 0) -> httpx.AsyncClient:
    app = create_app(Redis.from_url(redis_server.url, decode_responses=True), keys,
                     key_quota=key_quota)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sched")


async def test_no_node_is_503_and_a_full_cluster_is_429_with_retry_after(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    async with scheduler(redis_server, keys) as client:
        none = await client.post("/v1/placements", json={"templateID": "base"})
        assert none.status_code == 503 and none.json()["error"] == "no_nodes"
        await beat(redis, keys, "a", limit=1)
        ok = await client.post("/v1/placements", json={"templateID": "base"})
        assert ok.status_code == 201, ok.text
        [placed] = ok.json()["placements"]
        assert placed["nodeID"] == "a" and placed["count"] == 1
        full = await client.post("/v1/placements", json={"templateID": "base"})
        assert full.status_code == 429
        assert full.json() == {"code": 429, "error": "cluster_full",
                               "message": full.json()["message"]}
        assert full.headers["Retry-After"] == "1"
        # Cancelled, the slot is free again at once.
        assert (await client.delete(f"/v1/reservations/{placed['reservationID']}")
                ).status_code == 204
        again = await client.post("/v1/placements", json={"templateID": "base"})
        assert again.status_code == 201


async def test_two_schedulers_racing_for_the_last_slots_never_double_book(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=5, running=2)
    await beat(redis, keys, "b", limit=3, running=2)
    # 4 free slots in all; 2 replicas x 20 concurrent requests.
    async with scheduler(redis_server, keys) as one, scheduler(redis_server, keys) as two:
        answers = await asyncio.gather(*(
            (one if i % 2 else two).post("/v1/placements", json={"templateID": "base"})
            for i in range(40)))
    granted = [a.json()["placements"][0]["nodeID"] for a in answers if a.status_code == 201]
    assert sorted(granted) == ["a", "a", "a", "b"]
    assert sum(a.status_code == 429 for a in answers) == 36


async def test_committed_creates_count_until_the_heartbeat_counts_them(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=2)
    async with scheduler(redis_server, keys) as client:
        first = (await client.post("/v1/placements", json={})).json()["placements"][0]
        await client.post(f"/v1/reservations/{first['reservationID']}/commit")
        # The heartbeat measured before the commit does not count it: still held.
        await registry.heartbeat(redis, keys, NodeInfo(node_id="a", address="http://a:3000",
                                 limit=2, starting_limit=2), [], measured_ms=0)
        second = await client.post("/v1/placements", json={})
        assert second.status_code == 201
        assert (await client.post("/v1/placements", json={})).status_code == 429
        await client.post(
            f"/v1/reservations/{second.json()['placements'][0]['reservationID']}/commit")
        # One measured after both commits, with both running: full by the node's own count.
        await beat(redis, keys, "a", limit=2, running=2)
        assert (await client.post("/v1/placements", json={})).status_code == 429
        # One of them gone: room for one.
        await beat(redis, keys, "a", limit=2, running=1)
        assert (await client.post("/v1/placements", json={})).status_code == 201


async def test_placement_follows_load_and_locality(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "busy", cpu_pct=90, running=8, limit=10)
    await beat(redis, keys, "idle", cpu_pct=5, running=1, limit=10)
    await beat(redis, keys, "origin", cpu_pct=50, running=5, limit=10,
               snapshots=["snap-1"])
    async with scheduler(redis_server, keys) as client:
        plain = (await client.post("/v1/placements", json={"templateID": "base"})).json()
        assert plain["placements"][0]["nodeID"] == "idle"
        resume = (await client.post("/v1/placements", json={
            "templateID": "base", "snapshotID": "snap-1", "origin": "origin"})).json()
        assert resume["placements"][0]["nodeID"] == "origin"
        # A memory image made on another kind of host restores nowhere here.
        other = await client.post("/v1/placements", json={
            "templateID": "base", "hostKey": "0123456789ab"})
        assert other.status_code == 429
        # A volume is mounted where it is checked out: that node wins over any load.
        await beat(redis, keys, "busy", cpu_pct=90, running=8, limit=10, volumes=["data"])
        near = (await client.post("/v1/placements", json={
            "templateID": "base", "volumes": ["other", "data"]})).json()
        assert near["placements"][0]["nodeID"] == "busy"
        elsewhere = (await client.post("/v1/placements", json={
            "templateID": "base", "volumes": ["not-held-anywhere"]})).json()
        assert elsewhere["placements"][0]["nodeID"] == "idle"


async def test_a_fork_spreads_over_nodes_when_one_is_full(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=4, running=1)
    await beat(redis, keys, "b", limit=4, running=0)
    await beat(redis, keys, "c", limit=4, running=2)
    async with scheduler(redis_server, keys) as client:
        whole = await client.post("/v1/placements", json={"count": 8})
        assert whole.status_code == 429  # no single node has 8
        spread = await client.post("/v1/placements", json={"count": 8, "spread": True})
        assert spread.status_code == 201, spread.text
        counts = {p["nodeID"]: p["count"] for p in spread.json()["placements"]}
        assert sum(counts.values()) == 8
        assert all(counts[n] <= free for n, free in {"a": 3, "b": 4, "c": 2}.items()
                   if n in counts)
        # 1 slot left in the cluster: a spread of 2 is refused and holds nothing.
        assert (await client.post("/v1/placements", json={"count": 2, "spread": True})
                ).status_code == 429
        assert (await client.post("/v1/placements", json={"count": 1})).status_code == 201


async def test_health_by_heartbeat_age_and_draining_nodes_get_nothing(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "old")
    await beat(redis, keys, "leaving", state="draining")
    # Age "old"'s heartbeat by hand: 10 s ago is suspect (6 s), not lost (20 s).
    stamp = int(await redis.hget(keys.node("old"), "heartbeat_ms") or 0)
    await redis.hset(keys.node("old"), "heartbeat_ms", stamp - 10_000)
    async with scheduler(redis_server, keys) as client:
        health = {n["node_id"]: n["health"] for n in (await client.get("/v1/nodes")).json()}
        assert health == {"old": "suspect", "leaving": "draining"}
        # Reachable (draining) but nowhere to place: full, not unavailable.
        assert (await client.post("/v1/placements", json={})).status_code == 429
        await redis.hset(keys.node("old"), "heartbeat_ms", stamp - 30_000)
        health = {n["node_id"]: n["health"] for n in (await client.get("/v1/nodes")).json()}
        assert health["old"] == "lost"


async def test_an_abandoned_reservation_expires(redis: Redis, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=1)
    held = await reserve.reserve(redis, keys, "a", "r1", 1, fresh_s=6, ttl_ms=300)
    assert held.count == 1
    assert (await reserve.reserve(redis, keys, "a", "r2", 1, fresh_s=6)).reason == "full"
    await asyncio.sleep(0.4)
    assert (await reserve.reserve(redis, keys, "a", "r3", 1, fresh_s=6)).count == 1


async def _place(client: httpx.AsyncClient, key: str, **more: object) -> httpx.Response:
    return await client.post("/v1/placements", json={"templateID": "base", "key": key, **more})


async def test_a_key_holds_its_quota_and_no_more_across_nodes_and_schedulers(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=10)
    await beat(redis, keys, "b", limit=10)
    async with scheduler(redis_server, keys, key_quota=5) as one, \
            scheduler(redis_server, keys, key_quota=5) as two:
        # Racing from two replicas: 5 for key aa, however the 20 requests interleave.
        answers = await asyncio.gather(*(_place(one if i % 2 else two, "aa")
                                         for i in range(20)))
        granted = [a for a in answers if a.status_code == 201]
        assert len(granted) == 5
        refused = [a for a in answers if a.status_code == 429]
        assert {a.json()["error"] for a in refused} == {"quota_exceeded"}
        assert all(a.headers["Retry-After"] == "1" for a in refused)
        # Another key is not held back by it; nodes still have room.
        assert (await _place(one, "bb")).status_code == 201
        # A cancelled reservation gives its slot back; a committed one keeps it as its
        # sandbox, until the sandbox is killed (forget) or gone from every roster.
        first, second, *rest = [a.json()["placements"][0]["reservationID"] for a in granted]
        await one.delete(f"/v1/reservations/{first}")
        assert (await _place(one, "aa")).status_code == 201
        await one.post(f"/v1/reservations/{second}/commit", json={"sandboxIDs": ["s1"]})
        assert await redis.zscore(keys.key_sandboxes("aa"), "s1") is not None
        assert (await _place(one, "aa")).status_code == 429
        await reserve.forget(redis, keys, "aa", "s1")
        assert (await _place(one, "aa")).status_code == 201
        # A fork spread asks for several at once: all within the quota, or none.
        for reservation in rest:
            await one.delete(f"/v1/reservations/{reservation}")
        over = await _place(one, "cc", count=8, spread=True)
        assert over.status_code == 429 and over.json()["error"] == "quota_exceeded"
        assert await redis.zcard(keys.key_pending("cc")) == 0  # given back
        spread = await _place(one, "cc", count=5, spread=True)
        assert sum(p["count"] for p in spread.json()["placements"]) == 5


async def test_sandboxes_that_ended_on_their_own_stop_counting(
        redis: Redis, keys: Keys) -> None:
    info = NodeInfo(node_id="a", address="http://a:3000", limit=10, starting_limit=10)
    await registry.heartbeat(redis, keys, info, roster=["alive"],
                             measured_ms=await registry.now_ms(redis))
    for sandbox_id in ("alive", "ended"):
        await reserve.count(redis, keys, "aa", sandbox_id)
    assert await reserve.forget_gone(redis, keys) == 0  # within the grace: both count
    assert await reserve.forget_gone(redis, keys, grace_ms=0) == 1
    assert await redis.zrange(keys.key_sandboxes("aa"), 0, -1) == ["alive"]


async def test_without_a_quota_keys_are_not_counted_against_one(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    await beat(redis, keys, "a", limit=3)
    async with scheduler(redis_server, keys) as client:
        answers = [await _place(client, "aa") for _ in range(4)]
    assert [a.status_code for a in answers] == [201, 201, 201, 429]
    assert answers[-1].json()["error"] == "cluster_full"
    assert await redis.zcard(keys.key_pending("aa")) == 0
