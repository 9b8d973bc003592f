"""Part 7: CPU of an idle sandbox (% of one core), against a bare sandbox running only sleep.

Both are measured over the same window (interleaved by construction): utime + stime from
``/proc/<pid>/stat`` of every host process of the sandbox (the sentry, the gofer, the systrap
stubs), sampled each second for the per-second p50/p95 and over the whole window for the
headline value.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from bench.envd_bench.common import Latency
from bench.lifecycle.bare import BareEnvd
from bench.lifecycle.common import BARE_CGROUP, TARGET_IDLE_CPU_PCT, Report, Row, log, run_true
from bench.lifecycle.node import LifecycleNode
from bench.node_bench.memory import sandbox_pids

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Before the window: the restore's and the first command's after-effects settle.
SETTLE_S = 3.0


def cpu_ticks(pids: set[int]) -> int:
    """utime + stime (clock ticks) summed over ``pids`` (fields 14 and 15 of stat)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total


def measure_idle_cpu(report: Report, node: LifecycleNode, bare: BareEnvd, window_s: float) -> None:
    sandbox = node.create()
    bare_id = bare.start_sleep()
    try:
        run_true(sandbox)
        time.sleep(SETTLE_S)
        pids = {
            "node": sandbox_pids(sandbox.sandbox_id),
            "bare": sandbox_pids(bare_id, BARE_CGROUP),
        }
        first = {k: cpu_ticks(p) for k, p in pids.items()}
        last, start = dict(first), time.monotonic()
        prev = start
        while time.monotonic() - start < window_s:
            time.sleep(1.0)
            now = time.monotonic()
            for kind, p in pids.items():
                ticks = cpu_ticks(p)
                report.add(
                    f"idle_cpu_{kind}_per_s", 100.0 * (ticks - last[kind]) / CLK_TCK / (now - prev)
                )
                last[kind] = ticks
            prev = now
        elapsed = prev - start
    finally:
        with contextlib.suppress(Exception):
            sandbox.kill()
        bare.delete(bare_id)
    pct = {k: round(100.0 * (last[k] - first[k]) / CLK_TCK / elapsed, 3) for k in pids}
    report.memory["idle_cpu"] = {
        "window_s": round(elapsed, 1),
        "node_pct": pct["node"],
        "bare_sleep_pct": pct["bare"],
        "processes": {k: len(p) for k, p in pids.items()},
    }
    log(f"  idle CPU over {elapsed:.0f} s: node {pct['node']} %, bare sleep {pct['bare']} %")

    def lat(kind: str) -> Latency | None:
        return report.lat(f"idle_cpu_{kind}_per_s")

    report.rows.append(
        Row(
            "idle",
            f"idle sandbox CPU (% of one core over {elapsed:.0f} s)",
            None,
            target=TARGET_IDLE_CPU_PCT,
            unit="%",
            value=pct["node"],
            bare_name="bare sandbox running only sleep",
            bare_value=pct["bare"],
            issue="idle sandbox CPU (% of one core)",
            note=f"per-second p50/p95 {_pp(lat('node'))} (bare {_pp(lat('bare'))})",
        )
    )


def _pp(lat: Latency | None) -> str:
    return f"{lat.p50_ms:.2f}/{lat.p95_ms:.2f}" if lat else "-"
