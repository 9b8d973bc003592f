"""Part 1, latency: the SDK round trip next to the raw requests and the bare spawn under it."""

from __future__ import annotations

import statistics
from typing import Any

import httpx

from bench.envd_bench.common import SDK_CMD, Latency, Report, time_interleaved
from bench.envd_bench.raw import raw_health, raw_start, raw_unary_list


def in_sandbox_spawn_ms(sandbox: Any, command: str, count: int, repeats: int = 3) -> float:
    """Mean cost of spawning ``command`` from a shell loop inside the sandbox, in ms.

    Timed by the sandbox itself (``date +%s%N`` around the loop), so neither envd nor the SDK
    is in the measurement: this is the floor any daemon pays for running the same command.
    The median of ``repeats`` loops damps a noisy neighbour.
    """
    script = (
        f"s=$(date +%s%N); for i in $(seq {count}); do {command}; done; "
        f"e=$(date +%s%N); echo $(( (e - s) / {count} ))"
    )
    per_spawn_ns = [int(sandbox.commands.run(script).stdout.strip()) for _ in range(repeats)]
    return round(statistics.median(per_spawn_ns) / 1e6, 3)


def measure_latency(report: Report, sandbox: Any, url: str, runs: int, warmup: int) -> None:
    def sdk_run_true() -> None:
        result = sandbox.commands.run("true")
        if result.exit_code != 0:
            raise RuntimeError(f"commands.run('true') exited {result.exit_code}")

    with httpx.Client(base_url=url, timeout=60) as client:  # one keep-alive connection
        samples = time_interleaved(
            {
                'SDK commands.run("true")': sdk_run_true,
                "raw Start /bin/bash -l -c true": raw_start(client, *SDK_CMD, root=False),
                "raw Start /bin/true": raw_start(client, "/bin/true", [], root=False),
                "raw Start /bin/true as root": raw_start(client, "/bin/true", [], root=True),
                "raw unary List": raw_unary_list(client),
                "GET /health": raw_health(client),
            },
            runs,
            warmup,
        )
    report.latency = [Latency.of(name, ms) for name, ms in samples.items()]
    bash = in_sandbox_spawn_ms(sandbox, "/bin/bash -l -c true", runs)
    true = in_sandbox_spawn_ms(sandbox, "/bin/true", runs)
    p50 = {lat.name: lat.p50_ms for lat in report.latency}
    sdk = p50['SDK commands.run("true")']
    report.derived = {
        "bare_spawn_bash_login_ms": bash,
        "bare_spawn_bin_true_ms": true,
        # The question the issue asks: what does envd add on top of spawning the command?
        "envd_overhead_ms": round(sdk - bash, 3),
        # Same request, different client: the SDK's Rust HTTP stack vs httpx (can be < 0).
        "sdk_vs_httpx_client_ms": round(sdk - p50["raw Start /bin/bash -l -c true"], 3),
        "uid_switch_cost_ms": round(
            p50["raw Start /bin/true"] - p50["raw Start /bin/true as root"], 3
        ),
    }
