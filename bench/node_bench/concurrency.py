"""Part 4, concurrency: N creates released at once on the cold node."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from bench.envd_bench.common import Latency
from bench.node_bench.common import (
    CONCURRENT_REQUEST_TIMEOUT_S,
    NODE_CGROUP,
    Report,
    cgroup_cpu_ms,
    ms_since,
    p50,
    process_cpu_ms,
)
from bench.node_bench.node import Node


def measure_concurrent(report: Report, node: Node, count: int) -> None:
    """``count`` creates released at once, each followed by a command; wall time, per-create
    latency, the server's phases and the CPU they took."""
    barrier = threading.Barrier(count)
    sandboxes: list[Any] = []
    lock = threading.Lock()

    def one(_: int) -> tuple[float, float, float]:
        barrier.wait()
        start = time.perf_counter()
        sandbox = node.create(request_timeout=CONCURRENT_REQUEST_TIMEOUT_S)
        with lock:
            sandboxes.append(sandbox)
        create_ms = ms_since(start)
        if (code := sandbox.commands.run("true").exit_code) != 0:
            raise RuntimeError(f"first command exited {code}")
        return start, create_ms, time.perf_counter()

    load = os.getloadavg()[0]
    results: list[tuple[float, float, float]] = []
    failures: list[str] = []
    server_cpu = process_cpu_ms(node.server.process.pid)
    sandbox_cpu: list[float] = []
    try:
        with ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(one, i) for i in range(count)]
            for future in futures:
                try:
                    results.append(future.result())
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        server_cpu = process_cpu_ms(node.server.process.pid) - server_cpu
        for sandbox in sandboxes:
            if (cpu := cgroup_cpu_ms(f"{NODE_CGROUP}/{sandbox.sandbox_id}")) is not None:
                sandbox_cpu.append(cpu)
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.kill(), sandboxes))
    report.errors += [f"concurrent create: {f}" for f in failures]
    if not results:
        return
    wall_ms = (max(r[2] for r in results) - min(r[0] for r in results)) * 1000
    lines = node.created_lines()
    mine = [lines[s.sandbox_id] for s in sandboxes if s.sandbox_id in lines]
    names = list(dict.fromkeys(k for phases in mine for k in phases))
    report.concurrent = {
        "count": count,
        "succeeded": len(results),
        "wall_ms": round(wall_ms, 1),
        "loadavg_before": round(load, 2),
        "server_cpu_ms": round(server_cpu, 1),
        "sandbox_cpu_ms_p50": p50(sandbox_cpu) if sandbox_cpu else None,
        "cpu_per_create_ms": round((sum(sandbox_cpu) + server_cpu) / len(sandbox_cpu), 1)
        if sandbox_cpu
        else None,
        "create": asdict(Latency.of("create", [r[1] for r in results])),
        "create_to_first_command": asdict(
            Latency.of("create → first command", [(r[2] - r[0]) * 1000 for r in results])
        ),
        "server_phases_p50_ms": {k: p50([m[k] for m in mine if k in m]) for k in names},
        "server_phases_max_ms": {k: max(m[k] for m in mine if k in m) for k in names},
    }
