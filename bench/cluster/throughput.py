"""Creates/s through a gateway: one burst with every node of the layout, one with one node."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tests.cluster.layout import Layout
from tests.server.harness import API_KEY

from bench.cluster.common import log, summary


def burst(layout: Layout, creates: int, concurrency: int) -> dict[str, Any]:
    gateways = layout.gateways
    made: list[str] = []
    latencies: list[float] = []
    refused = 0

    def create(i: int) -> None:
        nonlocal refused
        url = gateways[i % len(gateways)].url
        with httpx.Client(timeout=300, headers={"X-API-KEY": API_KEY}) as client:
            for _ in range(20):
                started = time.perf_counter()
                answer = client.post(f"{url}/sandboxes",
                                     json={"templateID": "base", "timeout": 300})
                if answer.status_code == 201:
                    latencies.append((time.perf_counter() - started) * 1000)
                    made.append(answer.json()["sandboxID"])
                    return
                if answer.status_code != 429:
                    raise AssertionError(f"create: {answer.status_code} {answer.text[:200]}")
                refused += 1
                time.sleep(float(answer.headers.get("retry-after", "1")))
            raise AssertionError("create refused 20 times")

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(create, range(creates)))
    took = time.perf_counter() - started
    with httpx.Client(timeout=60, headers={"X-API-KEY": API_KEY}) as client, \
         ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda sid: client.delete(f"{gateways[0].url}/sandboxes/{sid}"), made))
    result = {"nodes": len(layout.nodes), "creates": creates, "seconds": round(took, 2),
              "creates_per_s": round(creates / took, 2), "retried_429": refused,
              "latency_ms": summary(latencies)}
    log(f"{len(layout.nodes)} node(s): {result['creates_per_s']} creates/s")
    return result
