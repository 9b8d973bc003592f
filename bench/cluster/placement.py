"""Placement decision time: the scheduler's placement and cancel, against a Redis PING."""

from __future__ import annotations

import time
from typing import Any

import httpx
from redis import Redis
from tests.cluster.layout import Layout

from bench.cluster.common import ratio, summary


def measure(layout: Layout, rounds: int) -> dict[str, Any]:
    scheduler = layout.schedulers[0]
    place, cancel, ping = [], [], []
    redis = Redis.from_url(layout.redis.url)
    try:
        with httpx.Client(base_url=scheduler.url, timeout=30) as client:
            for i in range(rounds + 10):
                started = time.perf_counter()
                answer = client.post("/v1/placements", json={"templateID": "base"})
                placed = time.perf_counter()
                if answer.status_code != 201:
                    raise AssertionError(f"placement: {answer.status_code} {answer.text}")
                [placement] = answer.json()["placements"]
                client.delete(f"/v1/reservations/{placement['reservationID']}")
                cancelled = time.perf_counter()
                redis.ping()
                pinged = time.perf_counter()
                if i >= 10:
                    place.append((placed - started) * 1000)
                    cancel.append((cancelled - placed) * 1000)
                    ping.append((pinged - cancelled) * 1000)
    finally:
        redis.close()
    rows = {"placement": summary(place), "cancel": summary(cancel), "redis PING": summary(ping)}
    return {"rows": rows, "ratio": {"placement / PING": ratio(rows["placement"],
                                                              rows["redis PING"])}}
