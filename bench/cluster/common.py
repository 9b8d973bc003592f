"""What the cluster benchmark's parts share: percentiles and the log."""

from __future__ import annotations

import statistics
import sys


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {"n": len(samples_ms), "p50": round(statistics.median(samples_ms), 3),
            "p95": round(pct(samples_ms, 0.95), 3), "max": round(max(samples_ms), 3)}


def ratio(over: dict[str, float], under: dict[str, float]) -> float:
    return round(over["p50"] / under["p50"], 2) if under["p50"] else 0.0
