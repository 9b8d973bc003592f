"""Parts 1 and 2: create → first command on each node, interleaved with the bare baseline."""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.envd_bench.common import Latency
from bench.node_bench.bare import BareRunsc
from bench.node_bench.common import (
    NODE_CGROUP,
    CreateSample,
    Report,
    cgroup_cpu_ms,
    ms_since,
    p50,
    process_cpu_ms,
)
from bench.node_bench.node import Node


def timed_create(node: Node) -> tuple[Any, CreateSample]:
    server_cpu = process_cpu_ms(node.server.process.pid)
    start = time.perf_counter()
    sandbox = node.create()
    create_ms = ms_since(start)
    mid = time.perf_counter()
    result = sandbox.commands.run("true")
    first_ms = ms_since(mid)
    if result.exit_code != 0:
        raise RuntimeError(f"first command exited {result.exit_code}")
    return sandbox, CreateSample(
        node.name,
        sandbox.sandbox_id,
        round(create_ms, 3),
        round(first_ms, 3),
        round(create_ms + first_ms, 3),
        cgroup_cpu_ms(f"{NODE_CGROUP}/{sandbox.sandbox_id}"),
        round(process_cpu_ms(node.server.process.pid) - server_cpu, 1),
    )


def measure_create(report: Report, nodes: list[Node], bare: BareRunsc, runs: int) -> None:
    """``runs`` rounds of: cold create, bare runsc, warm create (each timed alone, with
    every warm pool full and nothing booting in the background), then untimed cleanup."""
    for i in range(runs + 1):  # round 0 is a warm-up
        for node in nodes:
            if not node.wait_pool_full():
                report.errors.append(f"{node.name}: warm pool not refilled within 120 s")
        samples: list[CreateSample] = []
        sandboxes: list[tuple[Node, Any]] = []
        bare_sample = None
        try:
            for node in nodes:
                sandbox, sample = timed_create(node)
                sandboxes.append((node, sandbox))
                samples.append(sample)
                if node is nodes[0]:
                    bare_sample = bare.once()
        finally:
            for _, sandbox in sandboxes:
                sandbox.kill()
        if i == 0:
            continue
        report.create_samples += samples
        if bare_sample is not None:
            report.bare_samples.append(bare_sample)
        print(
            f"  round {i}/{runs}: "
            + ", ".join(f"{s.variant} {s.create_ms:.0f}+{s.first_command_ms:.0f}" for s in samples)
            + (f", bare {bare_sample.run_ms:.0f}+{bare_sample.exec_ms:.0f}" if bare_sample else "")
            + " ms",
            file=sys.stderr,
        )
    for node in nodes:
        lines = node.created_lines()
        for s in report.create_samples:
            if s.variant == node.name and s.sandbox_id in lines:
                s.server_phases_ms = lines[s.sandbox_id]
    for node in nodes:
        mine = [s for s in report.create_samples if s.variant == node.name]
        report.create[node.name] = [
            Latency.of(f"{node.name}: Sandbox.create()", [s.create_ms for s in mine]),
            Latency.of(
                f'{node.name}: first commands.run("true")', [s.first_command_ms for s in mine]
            ),
            Latency.of(f"{node.name}: create → first command", [s.total_ms for s in mine]),
        ]
        phase_names: list[str] = []
        for s in mine:
            phase_names += [k for k in s.server_phases_ms if k not in phase_names]
        report.phases[node.name] = {
            k: p50([s.server_phases_ms[k] for s in mine if k in s.server_phases_ms])
            for k in phase_names
        }
        for key in ("sandbox_cpu_ms", "server_cpu_ms"):
            values = [v for s in mine if (v := getattr(s, key)) is not None]
            if values:
                report.phases[node.name][key] = p50(values)
    bare_cpu = [b.sandbox_cpu_ms for b in report.bare_samples if b.sandbox_cpu_ms is not None]
    if bare_cpu:
        report.phases["bare"] = {"sandbox_cpu_ms": p50(bare_cpu)}
    report.bare = [
        Latency.of("bare: runsc run -detach", [b.run_ms for b in report.bare_samples]),
        Latency.of("bare: first runsc exec true", [b.exec_ms for b in report.bare_samples]),
        Latency.of("bare: run → first exec answered", [b.total_ms for b in report.bare_samples]),
    ]
