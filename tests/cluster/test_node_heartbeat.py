"""A real node process joined to a real Redis (``AENV_CLUSTER``): its heartbeats carry its
address, capacity and roster, the scheduler places on it, and the E2B SDK creates at the
address it was given. Redis going away and coming back costs the node nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.scheduler import create_app
from tests.redis_server import RedisServer
from tests.server.harness import NodeServer, serving

pytestmark = pytest.mark.gvisor

PREFIX = "hb"


@pytest.fixture(scope="module")
def node(redis_server: RedisServer) -> Iterator[NodeServer]:
    with serving(cluster=redis_server.url, node_id="node-a", heartbeat_interval_s="0.5",
                 max_sandboxes="3") as server:
        yield server


def heartbeat(redis_server: RedisServer, node_id: str, timeout_s: float = 15.0,
              **wanted: str) -> dict[str, str]:
    client = SyncRedis.from_url(redis_server.url, decode_responses=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            fields = client.hgetall(Keys().node(node_id))
            if fields and all(fields.get(k) == v for k, v in wanted.items()):
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"no heartbeat with {wanted} in {timeout_s}s: {fields}")
            time.sleep(0.1)
    finally:
        client.close()


def roster(redis_server: RedisServer, node_id: str) -> set[str]:
    client = SyncRedis.from_url(redis_server.url, decode_responses=True)
    try:
        return set(client.smembers(Keys().roster(node_id)))
    finally:
        client.close()


def test_the_node_announces_itself_and_its_sandboxes(
        node: NodeServer, redis_server: RedisServer) -> None:
    fields = heartbeat(redis_server, "node-a")
    assert fields["address"] == f'"http://127.0.0.1:{node.port}"'
    assert fields["limit"] == "3" and fields["state"] == '"ready"'
    assert fields["host_key"] != '""'
    sandbox = Sandbox.create(timeout=120)
    try:
        heartbeat(redis_server, "node-a", running="1")
        assert sandbox.sandbox_id in roster(redis_server, "node-a")
    finally:
        sandbox.kill()
    heartbeat(redis_server, "node-a", running="0")
    # Gone from the roster once its teardown is done (a killing sandbox is still there).
    deadline = time.monotonic() + 15
    while sandbox.sandbox_id in roster(redis_server, "node-a"):
        assert time.monotonic() < deadline, "a killed sandbox stayed on the roster"
        time.sleep(0.1)


@pytest.mark.anyio
async def test_the_scheduler_places_on_the_node_and_the_sdk_creates_there(
        node: NodeServer, redis_server: RedisServer) -> None:
    heartbeat(redis_server, "node-a", running="0")
    app = create_app(Redis.from_url(redis_server.url, decode_responses=True), Keys())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://scheduler") as scheduler:
        answer = await scheduler.post("/v1/placements", json={"templateID": "base"})
        assert answer.status_code == 201, answer.text
        [placed] = answer.json()["placements"]
        assert placed["nodeID"] == "node-a"
        sandbox = Sandbox.create(timeout=120, api_url=placed["address"])
        try:
            await scheduler.post(f"/v1/reservations/{placed['reservationID']}/commit")
            assert sandbox.commands.run("echo placed").stdout == "placed\n"
            # Three at most: this one, and two more reservations fill the node.
            more = await scheduler.post("/v1/placements", json={"count": 2})
            assert more.status_code == 201
            full = await scheduler.post("/v1/placements", json={})
            assert full.status_code == 429 and full.json()["error"] == "cluster_full"
            for p in more.json()["placements"]:
                await scheduler.delete(f"/v1/reservations/{p['reservationID']}")
        finally:
            sandbox.kill()


def test_redis_gone_and_back_costs_the_node_nothing(
        node: NodeServer, redis_server: RedisServer) -> None:
    heartbeat(redis_server, "node-a")
    redis_server.kill()
    try:
        sandbox = Sandbox.create(timeout=120)
        try:
            assert sandbox.commands.run("true").exit_code == 0
        finally:
            sandbox.kill()
    finally:
        redis_server.start()
    # An empty Redis (no persistence): the node's next heartbeats rebuild its entry.
    fields = heartbeat(redis_server, "node-a", running="0")
    assert fields["address"] == f'"http://127.0.0.1:{node.port}"'
    assert "Traceback" not in node.log()
