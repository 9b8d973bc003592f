"""Gateway latency: the same calls through a gateway and straight to the sandbox's node."""

from __future__ import annotations

import time
from typing import Any

import httpx
from e2b import Sandbox
from tests.cluster.layout import Layout
from tests.cluster.test_gateway import node_of
from tests.server.harness import API_KEY

from bench.cluster.common import ratio, summary

ENVD_PORT = 49983


def _timed(client: httpx.Client, method: str, url: str, **kw: Any) -> float:
    started = time.perf_counter()
    answer = client.request(method, url, **kw)
    took = (time.perf_counter() - started) * 1000
    if answer.status_code != 200:
        raise AssertionError(f"{method} {url}: {answer.status_code} {answer.text[:200]}")
    return took


def measure(layout: Layout, rounds: int) -> dict[str, Any]:
    gateway = layout.gateways[0]
    sbx = Sandbox.create(timeout=600, api_url=gateway.url, sandbox_url=gateway.url,
                         api_key=API_KEY, domain="aenv.test")
    try:
        node = layout.nodes[layout.index_of(node_of(layout.redis, sbx.sandbox_id))]
        sbx.files.write("/home/user/probe.txt", "x" * 64)
        api = {"X-API-KEY": API_KEY}
        envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT),
                "X-Access-Token": sbx._envd_access_token or ""}
        read = {"path": "/home/user/probe.txt", "username": "user"}
        samples: dict[str, list[float]] = {k: [] for k in (
            "info via gateway", "info direct", "file read via gateway", "file read direct")}
        with httpx.Client(timeout=30) as client:
            for i in range(rounds + 10):
                got = {
                    "info via gateway": _timed(client, "GET", f"{gateway.url}/sandboxes/"
                                               f"{sbx.sandbox_id}", headers=api),
                    "info direct": _timed(client, "GET", f"{node.url}/sandboxes/"
                                          f"{sbx.sandbox_id}", headers=api),
                    "file read via gateway": _timed(client, "GET", f"{gateway.url}/files",
                                                    headers=envd, params=read),
                    "file read direct": _timed(client, "GET", f"{node.url}/files",
                                               headers=envd, params=read),
                }
                if i >= 10:  # the first ten warm connections and caches
                    for key, value in got.items():
                        samples[key].append(value)
        rows = {key: summary(values) for key, values in samples.items()}
        return {"rows": rows, "ratio": {
            "info": ratio(rows["info via gateway"], rows["info direct"]),
            "file read": ratio(rows["file read via gateway"], rows["file read direct"])}}
    finally:
        sbx.kill()
