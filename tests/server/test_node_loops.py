"""``GET /node/loops``: every background loop of a running node is owned by its supervisor
and reported (``orchestrator/supervisor.py``)."""

from __future__ import annotations

import httpx

from tests.server.harness import API_KEY, NodeServer

#: What every node with the default settings runs (gc and pool-trim included: the defaults
#: collect garbage and use disk workspaces).
EXPECTED = {"ttl", "idle", "liveness", "reaper", "gc", "pool-trim", "spiller",
            "death-watch", "warm-pool", "precreated-pool"}


def test_every_background_loop_is_supervised_and_reported(server: NodeServer) -> None:
    r = httpx.get(f"{server.url}/node/loops", headers={"X-API-KEY": API_KEY}, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    states = {loop["name"]: loop["state"] for loop in body["loops"]}
    running = {name for name, state in states.items() if state == "running"}
    # Pools of size 0 have nothing to fill: their loops are not started, or done.
    assert EXPECTED - {"warm-pool", "precreated-pool"} <= running, states
    assert body["healthy"] is True
    assert all(loop["failures"] == 0 and loop["lastError"] is None for loop in body["loops"])
    assert httpx.get(f"{server.url}/node/loops", timeout=10).status_code == 401
