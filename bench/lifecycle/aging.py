"""Part 5: snapshot and fork x4 fresh and after many commands (and a control)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.lifecycle.common import (
    FORK_RE,
    SNAPSHOT_RE,
    TARGET_AGED_RATIO,
    Report,
    Row,
    _p50,
    kill_all,
    log,
    p50,
    run_true,
)
from bench.lifecycle.fork import (
    fork_phases,
    node_fork,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.common import MIB, ms_since

# -- 5: aging ---------------------------------------------------------------------------------


AGING_COMMANDS = ("ps aux >/dev/null", "node -e 0", "true")
#: What a fork child of the aged sandbox is given to answer its first command (asked of the
#: SDK as both timeouts; a child that hangs was still reported only after ~60 s in practice).
AGING_FIRST_COMMAND_TIMEOUT_S = 30.0


def measure_aging(
    report: Report, node: LifecycleNode, runs: int, commands: int, threads: int = 4
) -> None:
    """Snapshot and fork x4 of one sandbox fresh, then after ``commands`` commands. The
    machine's load drifts over minutes, so the aged probes are also interleaved run by run
    with the same probes of a second sandbox that ran no commands (the control)."""
    from e2b import Sandbox

    sandbox = node.create()
    control = node.create()
    loads: dict[str, float] = {}
    by_kind: dict[str, list[float]] = {c: [] for c in AGING_COMMANDS}
    kids_by_stage: dict[str, list[list[str]]] = {}

    def snapshot(target: Any, stage: str) -> None:
        start = time.perf_counter()
        info = target.create_snapshot()
        report.add(f"aging_{stage}_snapshot", ms_since(start))
        snap = info.snapshot_id
        line = node.wait_line(SNAPSHOT_RE, lambda m: m["snap"] == snap, 0, 10)
        if line is not None:
            report.add(f"aging_{stage}_snapshot_mib", float(line["mb"]) * 1e6 / MIB)
            report.add(f"aging_{stage}_snapshot_save", float(line["save"]))
        Sandbox.delete_snapshot(info.snapshot_id, **node.opts())

    def fork(target: Any, stage: str) -> None:
        before = node.count(FORK_RE, lambda m: m["id"] == target.sandbox_id)
        start = time.perf_counter()
        try:
            run = node_fork(node, target, 4, AGING_FIRST_COMMAND_TIMEOUT_S)
        except Exception as exc:
            # Counted at the time it failed (a lower bound), so the p50 is not flattered.
            report.add(f"aging_{stage}_fork4", ms_since(start))
            report.add(f"aging_{stage}_fork4_failed", 1)
            report.errors.append(
                f"aging: fork x4 of the {stage} sandbox failed after {ms_since(start):.0f} ms: "
                f"{type(exc).__name__}: {str(exc)[:160]}"
            )
            log(f"  aging: fork x4 of the {stage} sandbox failed: {exc!r}"[:300])
            return
        kill_all(run.kids)
        kids_by_stage.setdefault(stage, []).append([k.sandbox_id for k in run.kids])
        report.add(f"aging_{stage}_fork4", run.all_ms)
        report.add(f"aging_{stage}_fork4_call", run.call_ms)
        report.add(f"aging_{stage}_fork4_first_command_max", max(run.first_ms))
        report.add(f"aging_{stage}_fork4_child_cpu", statistics.fmean(run.cpu_ms or [0.0]))
        line = node.wait_line(FORK_RE, lambda m: m["id"] == target.sandbox_id, before, 10)
        if line is not None:
            report.add(f"aging_{stage}_fork4_checkpoint", float(line["checkpoint"]))

    def summary(stage: str) -> str:
        return (
            f"snapshot p50 {_p50(report, f'aging_{stage}_snapshot')} ms "
            f"({_p50(report, f'aging_{stage}_snapshot_mib')} MiB), fork x4 p50 "
            f"{_p50(report, f'aging_{stage}_fork4')} ms"
        )

    try:
        run_true(sandbox)
        run_true(control)
        loads["load_fresh"] = round(os.getloadavg()[0], 2)
        for _ in range(runs):
            snapshot(sandbox, "fresh")
        for _ in range(runs):
            fork(sandbox, "fresh")
        log(f"  aging fresh: {summary('fresh')}")
        done = 0
        lock = threading.Lock()
        start = time.perf_counter()

        def worker(k: int) -> None:
            nonlocal done
            for j in range(k, commands, threads):
                command = AGING_COMMANDS[j % len(AGING_COMMANDS)]
                begin = time.perf_counter()
                result = sandbox.commands.run(command, timeout=120)
                if result.exit_code != 0:
                    raise RuntimeError(f"aging command {command!r} exited {result.exit_code}")
                with lock:
                    done += 1
                    by_kind[command].append(ms_since(begin))

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        age_s = ms_since(start) / 1000
        log(f"  aging: {done} commands in {age_s:.0f} s")
        loads["load_aged"] = round(os.getloadavg()[0], 2)
        for _ in range(runs):
            snapshot(control, "control")
            snapshot(sandbox, "aged")
        for _ in range(runs):
            fork(control, "control")
            fork(sandbox, "aged")
        log(f"  aging aged: {summary('aged')}; control: {summary('control')}")
    finally:
        kill_all([sandbox, control])
    report.phases["aging"] = {
        "commands": done,
        "threads": threads,
        "wall_s": round(age_s, 1),
        "command_p50_ms": {c: p50(v) for c, v in by_kind.items()},
        **loads,
    }
    for stage, kids_by_run in kids_by_stage.items():
        report.phases[f"aging_{stage}_fork4"] = {
            "fork_call_p50_ms": _p50(report, f"aging_{stage}_fork4_call"),
            "first_command_slowest_p50_ms": _p50(report, f"aging_{stage}_fork4_first_command_max"),
            "child_cpu_mean_p50_ms": _p50(report, f"aging_{stage}_fork4_child_cpu"),
            **fork_phases(node, kids_by_run),
        }
    for kind, name in (("snapshot", "snapshot"), ("fork4", "fork x4 → all answered")):
        fresh = report.lat(f"aging_fresh_{kind}")
        aged = report.lat(f"aging_aged_{kind}")
        control_lat = report.lat(f"aging_control_{kind}")
        ratio = round(aged.p50_ms / fresh.p50_ms, 2) if fresh and aged else None
        ratio_control = round(aged.p50_ms / control_lat.p50_ms, 2) if control_lat and aged else None
        report.rows += [
            Row("aging", f"{name}, fresh sandbox ({runs} runs)", fresh),
            Row(
                "aging",
                f"{name}, after {commands} commands ({runs} runs)",
                aged,
                note=(
                    f"{len(report.samples.get(f'aging_aged_{kind}_failed', []))} failed, "
                    "counted at their time of failure"
                    if report.samples.get(f"aging_aged_{kind}_failed")
                    else ""
                ),
            ),
            Row(
                "aging",
                f"{name}, control sandbox (no commands), interleaved with the aged runs",
                control_lat,
                plot_name=f"{name}, control (interleaved with aged)",
            ),
            Row(
                "aging",
                f"{name}: aged / fresh p50 (same sandbox, before/after)",
                None,
                target=TARGET_AGED_RATIO,
                unit="x",
                value=ratio,
            ),
            Row(
                "aging",
                f"{name}: aged / control p50 (interleaved)",
                None,
                target=TARGET_AGED_RATIO,
                unit="x",
                value=ratio_control,
            ),
        ]
    for stage in ("fresh", "aged", "control"):
        report.sizes[f"aging_{stage}_snapshot_mib_p50"] = _p50(
            report, f"aging_{stage}_snapshot_mib"
        )
