"""E2B's fleet metrics routes (docs/metrics.md), read with the SDK's own generated API client
against a node with the fake runtime: many sandboxes' usage in one call (only the caller's
running ones; 400 past 100 ids or for an id named twice), and a team's sandboxes up and start
rate over time, with its maximum; another team's metrics 403, an unknown team's 404."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from e2b.api import ApiClient
from e2b.api.client.api.sandboxes import get_sandboxes_metrics
from e2b.api.client.models import SandboxesWithMetrics, SandboxMetric
from e2b.connection_config import ConnectionConfig

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(runtime="fake", net_pool_size="4", warm_pool_size="0",
                 precreate_pool_size="0") as server:
        yield server


def _api(node: NodeServer, key: str = API_KEY) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": key}, timeout=60)


def test_many_sandboxes_metrics_at_once(node: NodeServer) -> None:
    with _api(node) as api:
        ids = [api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
               for _ in range(3)]
        assert api.post(f"/sandboxes/{ids[2]}/pause").status_code == 204
        team = api.post("/teams", json={"name": "metrics-other"}).json()
        with _api(node, team["apiKey"]) as other:
            theirs = other.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        with ApiClient(ConnectionConfig(api_key=API_KEY)) as client:
            got = get_sandboxes_metrics.sync(
                client=client, sandbox_ids=[*ids, theirs, "nosuchsandbox0000000"])
        assert isinstance(got, SandboxesWithMetrics), got
        found = got.sandboxes
        # Running and ours only: the paused one, the other team's and the unknown one are out.
        assert sorted(found) == sorted(ids[:2]), found
        metric = SandboxMetric.from_dict(found[ids[0]])
        assert metric.mem_total > 0 and metric.cpu_count >= 1
        for query in ({"sandbox_ids": ",".join(f"s{i:019d}" for i in range(101))},
                      {"sandbox_ids": f"{ids[0]},{ids[0]}"}, {"sandbox_ids": ""}, {}):
            bad = api.get("/sandboxes/metrics", params=query)
            assert bad.status_code == 400, (query, bad.text)
            assert bad.json()["code"] == 400
        for sandbox_id in ids:
            api.delete(f"/sandboxes/{sandbox_id}")
        with _api(node, team["apiKey"]) as other:
            other.delete(f"/sandboxes/{theirs}")


def test_a_teams_sandboxes_up_and_start_rate_over_time(node: NodeServer) -> None:
    with _api(node) as op:
        team = op.post("/teams", json={"name": "metered"}).json()
        outsider = op.post("/teams", json={"name": "outsider"}).json()
    team_id = team["teamID"]
    since = int(time.time()) - 5
    with _api(node, team["apiKey"]) as t:
        made = [t.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
                for _ in range(3)]
        deadline = time.monotonic() + 20
        while True:  # a sample every 5 s
            points = t.get(f"/teams/{team_id}/metrics", params={"start": since}).json()
            if any(p["concurrentSandboxes"] == 3 for p in points):
                break
            assert time.monotonic() < deadline, points
            time.sleep(1)
        assert all(set(p) == {"timestamp", "timestampUnix", "concurrentSandboxes",
                              "sandboxStartRate"} for p in points)
        stamps = [p["timestampUnix"] for p in points]
        assert stamps == sorted(stamps) and all(s % 5 == 0 for s in stamps)
        assert sum(p["sandboxStartRate"] for p in points) * 5 == pytest.approx(3)
        top = t.get(f"/teams/{team_id}/metrics/max",
                    params={"start": since, "metric": "concurrent_sandboxes"}).json()
        assert top["value"] == 3 and top["timestampUnix"] in stamps
        rate = t.get(f"/teams/{team_id}/metrics/max",
                     params={"start": since, "metric": "sandbox_start_rate"}).json()
        assert rate["value"] > 0
        for bad in ({"metric": "nope"}, {}, {"metric": "concurrent_sandboxes",
                                              "start": 10, "end": 5}):
            assert t.get(f"/teams/{team_id}/metrics/max", params=bad).status_code == 400
        for sandbox_id in made:
            t.delete(f"/sandboxes/{sandbox_id}")
    with _api(node, outsider["apiKey"]) as o:
        refused = o.get(f"/teams/{team_id}/metrics")
        assert refused.status_code == 403 and refused.json()["code"] == 403
    with _api(node) as op:
        assert op.get(f"/teams/{team_id}/metrics").status_code == 200  # the operator: any
        assert op.get("/teams/00000000-0000-0000-0000-000000000000/metrics").status_code == 404
