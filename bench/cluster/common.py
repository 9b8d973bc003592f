"""What the cluster benchmark's parts share: the burst benchmark's log and percentile, and
the summary and ratio of its tables."""

from __future__ import annotations

import statistics

from bench.burst_bench import log, pct

__all__ = ["log", "pct", "ratio", "summary"]


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {"n": len(samples_ms), "p50": round(statistics.median(samples_ms), 3),
            "p95": round(pct(samples_ms, 0.95), 3), "max": round(max(samples_ms), 3)}


def ratio(over: dict[str, float], under: dict[str, float]) -> float:
    return round(over["p50"] / under["p50"], 2) if under["p50"] else 0.0
