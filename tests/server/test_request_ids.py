"""A call followed through the node's logs (docs/deployment.md, "Logs"): with
``log_format = "json"`` every line is a JSON object, and the create's own line carries the
``X-Request-Id`` the caller sent, which the answer repeats; a call without one gets one made."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.server.harness import API_KEY, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_json_logs_carry_the_request_id() -> None:
    with serving(runtime="fake", net_pool_size="2", warm_pool_size="0",
                 log_format="json") as node, \
            httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}) as api:
        made = api.post("/sandboxes", json={"templateID": "base"},
                        headers={"X-Request-Id": "rl-step-42"})
        assert made.status_code == 201 and made.headers["x-request-id"] == "rl-step-42"
        other = api.get("/v2/sandboxes")
        assert len(other.headers["x-request-id"]) == 32
        sid = made.json()["sandboxID"]
        deadline = time.monotonic() + 10
        while True:
            lines = [json.loads(line) for line in node.log().splitlines()
                     if line.startswith("{")]
            mine = [line for line in lines if line.get("request_id") == "rl-step-42"]
            if any(sid in line["message"] for line in mine):
                break
            assert time.monotonic() < deadline, mine
            time.sleep(0.2)
        assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
        # Nothing but JSON: uvicorn's own lines too (tracebacks are inside their objects).
        plain = [line for line in node.log().splitlines()
                 if line.strip() and not line.startswith("{")]
        assert not plain, plain
        api.delete(f"/sandboxes/{sid}")
