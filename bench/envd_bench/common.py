"""What every part of the envd benchmark shares: its targets, result types and timer.

``Latency`` and ``time_interleaved`` are also the node benchmarks' (bench.node_bench,
bench.lifecycle): every latency row in docs/benchmarks.md is computed the same way.
"""

from __future__ import annotations

import base64
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "envd.json"
MIB = 1024 * 1024

#: Targets from the issue. Throughput and memory are in MiB (the conservative reading of "MB").
TARGET_ROUND_TRIP_P50_MS = 5.0
TARGET_THROUGHPUT_MIB_S = 200.0
TARGET_IDLE_RSS_MIB = 30.0

#: What the Python SDK sends for ``commands.run("true")`` (e2b-compat.md §4.3).
SDK_CMD = ("/bin/bash", ["-l", "-c", "true"])
#: Connect end-of-stream frame with no error: flags 0x02, length 2, ``{}``.
END_STREAM_OK = b"\x02\x00\x00\x00\x02{}"
ROOT_AUTH = "Basic " + base64.b64encode(b"root:").decode()


@dataclass
class Latency:
    """Latency of one operation over ``n`` timed runs (after a warm-up), in milliseconds."""

    name: str
    n: int
    p50_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float

    @classmethod
    def of(cls, name: str, samples_ms: list[float]) -> Latency:
        ordered = sorted(samples_ms)
        # Nearest-rank p95: an observed value, not an interpolation between two of them.
        p95 = ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]
        return cls(
            name,
            len(ordered),
            round(statistics.median(ordered), 3),
            round(p95, 3),
            round(statistics.fmean(ordered), 3),
            round(ordered[0], 3),
        )


@dataclass
class Throughput:
    """Transfer rate of one upload/download variant over ``runs`` transfers, MiB/s."""

    name: str
    size_mib: float
    runs: int
    p50_mib_s: float
    min_mib_s: float
    max_mib_s: float
    verified: bool
    error: str | None = None


@dataclass
class Memory:
    """envd's memory at one moment, MiB (PSS splits shared pages among their users)."""

    when: str
    pid: int
    rss_mib: float
    pss_mib: float | None
    pss_anon_mib: float | None
    peak_rss_mib: float


@dataclass
class Report:
    """Everything one run measured; serialised as-is to bench/results/envd.json."""

    meta: dict[str, Any]
    latency: list[Latency] = field(default_factory=list)
    derived: dict[str, float] = field(default_factory=dict)
    throughput: list[Throughput] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def time_interleaved(
    calls: dict[str, Callable[[], object]], runs: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time in ms of ``runs`` calls of each callable, after ``warmup`` untimed ones each.

    The callables take turns (A B C A B C ...) rather than running in blocks, so a noisy
    neighbour or a load drift on a shared 2 vCPU machine hits every variant alike and the
    differences between them (which is what the derived overheads are) stay meaningful.
    """
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples
