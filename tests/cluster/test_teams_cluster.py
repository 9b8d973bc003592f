"""Two teams on a three-node cluster with two schedulers and two gateways (``layout.py``: real
Redis, real S3 server, each node in a network namespace of its own; the fake runtime, since
what is checked is the door, not the sandboxes). Teams and keys live in the cluster's Redis
(docs/teams.md, "Cluster"): a team made through one gateway works on every node; a second
team reaches nothing of the first's through any route of a gateway; a key revoked through
one gateway is refused by every node and gateway at the next call; a team's quota holds
cluster-wide under 40 concurrent creates across both gateways."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.layout import Layout, cluster_layout
from tests.prometheus_scrape import scrape
from tests.server.harness import API_KEY
from tests.tenancy_walk import make_objects, walk

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
QUOTA = 5


@pytest.fixture(scope="module")
def lay() -> Iterator[Layout]:
    with cluster_layout(runtime="fake", net_pool_size="2", warm_pool_size="0",
                        max_sandboxes="20", max_concurrent_starts="8",
                        max_queued_starts="64") as layout:
        yield layout


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"X-API-KEY": key}, timeout=60)


def _team(lay: Layout, name: str, quota: dict[str, Any] | None = None) -> dict[str, Any]:
    with _client(lay.gateways[0].url, API_KEY) as op:
        made = op.post("/teams", json={"name": name, **({"quota": quota} if quota else {})})
    assert made.status_code == 201, made.text
    team: dict[str, Any] = made.json()
    return team


def test_a_team_made_through_one_gateway_works_everywhere_and_revokes_everywhere(
        lay: Layout) -> None:
    team = _team(lay, "everywhere")
    every = [*(n.url for n in lay.nodes), *(g.url for g in lay.gateways)]
    with _client(lay.gateways[1].url, team["apiKey"]) as t:
        second = t.post("/api-keys", json={"name": "rollouts"}).json()
    for url in every:
        with _client(url, second["key"]) as c:
            assert c.get("/v2/sandboxes").status_code == 200, url
    with _client(lay.gateways[0].url, team["apiKey"]) as t:
        assert t.delete(f"/api-keys/{second['id']}").status_code == 204
    # At once: no node or gateway lets it in again.
    for url in every:
        with _client(url, second["key"]) as c:
            assert c.get("/v2/sandboxes").status_code == 401, url
    # Its last use is the cluster's, whichever node saw it.
    with _client(lay.nodes[2].url, team["apiKey"]) as t:
        assert {k["name"] for k in t.get("/api-keys").json()} == {"default"}
    with _client(lay.gateways[1].url, API_KEY) as op:
        names = [t["name"] for t in op.get("/teams").json()]
        assert names.count("default") == 1 and "everywhere" in names


def test_a_second_team_reaches_nothing_of_the_first_through_a_gateway(lay: Layout) -> None:
    gateway = lay.gateways[0].url
    with _client(gateway, API_KEY) as a:
        made = a.post("/sandboxes", json={"templateID": "base", "timeout": 300})
        assert made.status_code == 201, made.text
        sandbox = made.json()
        ids, secrets = make_objects(a, sandbox["sandboxID"], sandbox["envdAccessToken"] or "",
                                    tag="ca")
        spec = a.get("/openapi.json").json()
    team_b = _team(lay, "cluster-b")
    with _client(lay.gateways[1].url, team_b["apiKey"]) as b:
        assert walk(b, spec, ids, secrets, team_b["teamID"]) >= 50
        # And straight to every node, past the gateways.
    for node in lay.nodes:
        with _client(node.url, team_b["apiKey"]) as b:
            assert b.get(f"/sandboxes/{sandbox['sandboxID']}").status_code == 404
            assert b.delete(f"/volumes/{ids['volume_id']}").status_code == 404
            assert ids["snapshot_id"] not in b.get("/snapshots").text
    with _client(gateway, API_KEY) as a:
        assert a.get(f"/sandboxes/{sandbox['sandboxID']}").json()["state"] == "running"
        assert a.delete(f"/sandboxes/{sandbox['sandboxID']}").status_code == 204


async def _creates(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    clients = [httpx.AsyncClient(base_url=u, headers={"X-API-KEY": key}, timeout=120)
               for u in urls]
    try:
        return list(await asyncio.gather(*(
            clients[i % len(clients)].post("/sandboxes", json={"templateID": "base",
                                                              "timeout": 300})
            for i in range(count))))
    finally:
        for client in clients:
            await client.aclose()


def test_a_team_quota_holds_across_the_cluster_under_forty_creates(lay: Layout) -> None:
    team = _team(lay, "capped", {"maxSandboxes": QUOTA})
    answers = asyncio.run(_creates([g.url for g in lay.gateways], team["apiKey"], 40))
    started = [a.json()["sandboxID"] for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 429]
    assert len(started) == QUOTA and len(refused) == 40 - QUOTA, \
        sorted(a.status_code for a in answers)
    assert all(a.headers.get("Retry-After") for a in refused)
    with _client(lay.gateways[1].url, team["apiKey"]) as t:
        assert sorted(s["sandboxID"] for s in t.get("/v2/sandboxes").json()) == sorted(started)
        assert t.delete(f"/sandboxes/{started[0]}").status_code == 204
    again = asyncio.run(_creates([g.url for g in lay.gateways], team["apiKey"], 4))
    assert sorted(a.status_code for a in again) == [201, 429, 429, 429]
    # Another team is not held by this one's quota.
    other = asyncio.run(_creates([lay.gateways[0].url], API_KEY, 3))
    assert [a.status_code for a in other] == [201, 201, 201]


def test_a_teams_memory_and_disk_hold_across_the_cluster(lay: Layout) -> None:
    """``maxMemoryMB`` and ``maxDiskMB`` are held by the nodes against the cluster's ledger
    (``cluster/team_usage.py``). Two of the team's sandboxes run on nodes 0 and 1, made
    there directly; 40 creates through two gateways then start exactly the one more the
    memory allows, wherever they land (no node's own count would stop there). A kill and a
    pause free memory for the next create at once; paused sandboxes keep their disk."""
    team = _team(lay, "sized")
    base = {"templateID": "base", "timeout": 300}
    with _client(lay.nodes[0].url, team["apiKey"]) as n0:
        first = n0.post("/sandboxes", json=base).json()["sandboxID"]
        info = n0.get(f"/sandboxes/{first}").json()
        memory, disk = info["memoryMB"], info["diskSizeMB"]
    with _client(lay.nodes[1].url, team["apiKey"]) as n1:
        second = n1.post("/sandboxes", json=base).json()["sandboxID"]
    # Started without a quota, they count from their nodes' next heartbeats (0.5 s here).
    time.sleep(1.2)
    with _client(lay.gateways[0].url, API_KEY) as op:
        assert op.patch(f"/teams/{team['teamID']}", json={"quota": {
            "maxMemoryMB": 3 * memory, "maxDiskMB": 4 * disk}}).status_code == 200
    answers = asyncio.run(_creates([g.url for g in lay.gateways], team["apiKey"], 40))
    started = [a.json()["sandboxID"] for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 429]
    assert len(started) == 1 and len(refused) == 39, sorted(a.status_code for a in answers)
    assert all(a.headers.get("Retry-After") for a in refused)
    assert f"quota of {3 * memory} MB of memory" in refused[0].json()["message"]
    with _client(lay.gateways[1].url, team["apiKey"]) as t:
        with _client(lay.nodes[0].url, team["apiKey"]) as n0:
            assert n0.delete(f"/sandboxes/{first}").status_code == 204
        again = t.post("/sandboxes", json=base)  # at once, not at the next heartbeat
        assert again.status_code == 201, again.text
        with _client(lay.nodes[1].url, team["apiKey"]) as n1:
            assert n1.post(f"/sandboxes/{second}/pause").status_code == 204
        after_pause = t.post("/sandboxes", json=base)
        assert after_pause.status_code == 201, after_pause.text  # 3 up, 1 paused: 4 disks
        assert t.post(f"/sandboxes/{started[0]}/pause").status_code == 204
        over_disk = t.post("/sandboxes", json=base)
        assert over_disk.status_code == 429, over_disk.text
        assert f"quota of {4 * disk} MB of disk" in over_disk.json()["message"]
    for node in lay.nodes:
        with _client(node.url, team["apiKey"]) as t:
            for sandbox in t.get("/v2/sandboxes", params={"state": "running,paused"}).json():
                t.delete(f"/sandboxes/{sandbox['sandboxID']}")


def test_a_teams_starts_per_second_hold_across_two_gateways(lay: Layout) -> None:
    """``startsPerSecond: 2`` through two gateways at once: the two count as one (at most
    two starts a second between them; a burst straddling a second may take four), the rest
    429 with ``Retry-After``; a second later the team starts again."""
    team = _team(lay, "paced", {"startsPerSecond": 2})
    answers = asyncio.run(_creates([g.url for g in lay.gateways], team["apiKey"], 12))
    started = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 429]
    assert 1 <= len(started) <= 4 and len(started) + len(refused) == 12, \
        sorted(a.status_code for a in answers)
    assert all(a.headers.get("Retry-After") == "1" for a in refused)
    assert "a second" in refused[0].json()["message"]
    time.sleep(1.1)
    again = asyncio.run(_creates([lay.gateways[1].url], team["apiKey"], 1))
    assert [a.status_code for a in again] == [201]
    with _client(lay.gateways[0].url, team["apiKey"]) as t:
        for sandbox in t.get("/v2/sandboxes").json():
            t.delete(f"/sandboxes/{sandbox['sandboxID']}")


def test_fleet_metrics_are_merged_over_the_nodes(lay: Layout) -> None:
    """Through a gateway, E2B's fleet metrics add up the nodes (``cluster/fleet_metrics.py``):
    a team's sandboxes on three nodes are one series and one maximum, and one batch request
    samples sandboxes on every node."""
    team = _team(lay, "fleet")
    since = int(time.time()) - 5
    made = []
    for node in lay.nodes:
        with _client(node.url, team["apiKey"]) as n:
            made.append(n.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"])
    with _client(lay.gateways[1].url, team["apiKey"]) as t:
        batch = t.get("/sandboxes/metrics", params={"sandbox_ids": ",".join(made)})
        assert batch.status_code == 200, batch.text
        assert sorted(batch.json()["sandboxes"]) == sorted(made)
        deadline = time.monotonic() + 20
        while True:  # each node samples every 5 s, at the same instants
            points = t.get(f"/teams/{team['teamID']}/metrics", params={"start": since}).json()
            if any(p["concurrentSandboxes"] == 3 for p in points):
                break
            assert time.monotonic() < deadline, points
            time.sleep(1)
        top = t.get(f"/teams/{team['teamID']}/metrics/max",
                    params={"start": since, "metric": "concurrent_sandboxes"}).json()
        assert top["value"] == 3
        assert t.get(f"/teams/{team['teamID']}/metrics/max",
                     params={"metric": "x"}).status_code == 400
        assert t.get("/sandboxes/metrics", params={"sandbox_ids": ""}).status_code == 400
    for node, sandbox_id in zip(lay.nodes, made, strict=True):
        with _client(node.url, team["apiKey"]) as n:
            n.delete(f"/sandboxes/{sandbox_id}")


def test_each_role_is_scraped_by_prometheus(lay: Layout) -> None:
    """Prometheus ``/metrics`` of the gateways, the schedulers and the nodes (docs/metrics.md),
    parsed by ``prometheus_client``'s own parser after a create through each gateway."""
    for gateway in lay.gateways:
        with _client(gateway.url, API_KEY) as op:
            made = op.post("/sandboxes", json={"templateID": "base"})
            assert made.status_code == 201, made.text
            op.delete(f"/sandboxes/{made.json()['sandboxID']}")
        assert httpx.get(f"{gateway.url}/metrics").status_code == 401
        got = scrape(gateway.url, {"Authorization": f"Bearer {API_KEY}"})
        assert got["aenv_gateway_requests_total"][(("code", "2xx"), ("route", "create"))] >= 1
        assert got["aenv_gateway_request_seconds_count"][(("route", "create"),)] >= 1
    placed = 0.0
    for scheduler in lay.schedulers:
        got = scrape(scheduler.url, {})
        placed += got["aenv_scheduler_placements_total"].get((("outcome", "ok"),), 0)
        assert got["aenv_cluster_nodes"][(("health", "ready"),)] == len(lay.nodes)
        assert got["aenv_cluster_sandboxes"][(("kind", "limit"),)] > 0
    assert placed >= len(lay.gateways)
    for node in lay.nodes:
        got = scrape(node.url, {"X-API-KEY": API_KEY})
        assert "aenv_operation_seconds_count" in got and "aenv_sandboxes" in got



def test_a_gateways_request_id_reaches_the_node(lay: Layout) -> None:
    """A create through a gateway without an ``X-Request-Id``: the gateway makes one, answers
    it, and sends it to the node, whose log line of the create ends in it."""
    with _client(lay.gateways[0].url, API_KEY) as op:
        made = op.post("/sandboxes", json={"templateID": "base"})
    assert made.status_code == 201, made.text
    rid, sid = made.headers["x-request-id"], made.json()["sandboxID"]
    deadline = time.monotonic() + 10
    while not any(sid in line and line.endswith(f"[request {rid}]")
                  for node in lay.nodes for line in node.log().splitlines()):
        assert time.monotonic() < deadline, rid
        time.sleep(0.2)
    with _client(lay.gateways[0].url, API_KEY) as op:
        op.delete(f"/sandboxes/{sid}")
