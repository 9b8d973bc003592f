"""Part 8: ``commands.run("true")`` through the node on a warm sandbox, against spawning
``bash -l -c true`` inside the sandbox (a shell loop timed there with ``date +%s%N``, as
bench.envd_bench.latency's "bare spawn": neither envd nor the SDK is in it), run by run.
"""

from __future__ import annotations

import contextlib

from bench.envd_bench.latency import in_sandbox_spawn_ms
from bench.lifecycle.common import TARGET_COMMAND_SLACK_MS, Report, Row, log, run_true
from bench.lifecycle.node import LifecycleNode

#: Spawns per timed loop inside the sandbox (one sample is their mean).
SPAWNS_PER_LOOP = 5
WARMUP = 3


def measure_first_command(report: Report, node: LifecycleNode, runs: int) -> None:
    sandbox = node.create()
    try:
        for _ in range(WARMUP):
            run_true(sandbox)
        for _ in range(runs):
            report.add("command_true", run_true(sandbox))
            report.add(
                "bare_spawn_bash",
                in_sandbox_spawn_ms(sandbox, "/bin/bash -l -c true", SPAWNS_PER_LOOP, repeats=1),
            )
    finally:
        with contextlib.suppress(Exception):
            sandbox.kill()
    sdk, spawn = report.lat("command_true"), report.lat("bare_spawn_bash")
    target = round(spawn.p50_ms + TARGET_COMMAND_SLACK_MS, 1) if spawn else None
    log(
        f"  commands.run('true') p50 {sdk and sdk.p50_ms} ms, "
        f"bash -l spawn {spawn and spawn.p50_ms}"
    )
    report.rows.append(
        Row(
            "command",
            'commands.run("true") round trip (warm sandbox)',
            sdk,
            spawn,
            "bash -l -c true spawned inside (date +%s%N loop)",
            target,
            issue='commands.run("true") round trip (SDK, warm sandbox)',
            note=f"target = bare spawn p50 + {TARGET_COMMAND_SLACK_MS:g} ms",
        )
    )
