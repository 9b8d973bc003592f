"""The node's Prometheus metrics (docs/metrics.md, "Prometheus"), scraped as Prometheus does
and parsed with ``prometheus_client``'s own parser: after one of each lifecycle operation,
every operation's latency histogram has its sample with outcome ``ok``; a refused start is
counted by its reason; proxied requests by status class; the gauges hold the node's state.
Only the operator reads it (its key, or as a bearer); a team's key is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.prometheus_scrape import scrape
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
OPERATIONS = ("create", "pause", "resume", "snapshot", "fork", "kill", "network")


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(runtime="fake", net_pool_size="4", warm_pool_size="0",
                 precreate_pool_size="0", max_sandboxes="4") as server:
        yield server



def test_a_scrape_after_each_operation(node: NodeServer) -> None:
    op = {"X-API-KEY": API_KEY}
    with httpx.Client(base_url=node.url, headers=op, timeout=60) as api:
        sid = api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        assert api.post(f"/sandboxes/{sid}/pause").status_code == 204
        assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}
                        ).status_code in (200, 201)
        assert api.post(f"/sandboxes/{sid}/snapshots", json={}).status_code == 201
        forked = api.post(f"/sandboxes/{sid}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        child = forked.json()[0]["sandbox"]["sandboxID"]
        assert api.put(f"/sandboxes/{sid}/network", json={"allow_internet_access": False}
                       ).status_code == 204
        filler = [api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
                  for _ in range(2)]
        refused = api.post("/sandboxes", json={"templateID": "base"})  # 4 up: the limit
        assert refused.status_code == 429
        # Proxied: envd's health through the node's proxy.
        envd = httpx.get(f"{node.url}/health", headers={"Host": f"49983-{sid}.aenv.test"},
                         timeout=30)
        assert envd.status_code in (200, 204), envd.text
        for s in (sid, child, *filler):
            assert api.delete(f"/sandboxes/{s}").status_code == 204
    # A kill answers once the sandbox is stopped; its histogram counts the whole teardown,
    # which ends a moment later, and log entries are counted when the logbook flushes.
    deadline = time.monotonic() + 15
    while True:
        got = scrape(node.url, {"Authorization": f"Bearer {API_KEY}"})
        counts = got["aenv_operation_seconds_count"]
        missing = [name for name in OPERATIONS
                   if counts.get((("operation", name), ("outcome", "ok")), 0) < 1]
        logged = got.get("aenv_sandbox_log_entries_total", {}).get((("source", "lifecycle"),), 0)
        if (not missing and logged >= 5) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, (missing, sorted(counts))
    buckets = got["aenv_operation_seconds_bucket"]
    assert buckets[(("le", "+Inf"), ("operation", "create"), ("outcome", "ok"))] \
        == counts[(("operation", "create"), ("outcome", "ok"))]
    assert got["aenv_admission_refusals_total"][(("reason", "node_full"),)] >= 1
    assert got["aenv_proxy_requests_total"][(("code", "2xx"),)] >= 1
    assert got["aenv_proxy_response_seconds_count"][()] >= 1
    assert got["aenv_host"][(("resource", "memory_total_bytes"),)] > 0
    assert (("state", "running"),) in got["aenv_sandboxes"]
    assert (("pool", "network_slots"),) in got["aenv_pool_ready"]
    assert got["process_resident_memory_bytes"][()] > 0
    assert sum(got["aenv_repository_blob_reads_total"].values()) >= 1  # the template's image
    assert (("cache", "blob_cache"),) in got["aenv_cache_bytes"]  # walked every 30 s
    assert got["aenv_sandbox_log_entries_total"][(("source", "lifecycle"),)] >= 5


def test_only_the_operator_reads_it(node: NodeServer) -> None:
    assert httpx.get(f"{node.url}/metrics").status_code == 401
    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}) as op:
        team_key = op.post("/teams", json={"name": "scrapers"}).json()["apiKey"]
        assert op.get("/metrics").status_code == 200
    assert httpx.get(f"{node.url}/metrics", headers={"X-API-KEY": team_key}).status_code == 403
    assert httpx.get(f"{node.url}/metrics",
                     headers={"Authorization": "Bearer nope"}).status_code == 401
