"""The command line: start the node and the bare runtime, run the parts, write the results."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.server.harness import kill_leaked

from aenv.core.settings import Settings
from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, loadavg, measured_on
from bench.lifecycle.aging import (
    measure_aging,
)
from bench.lifecycle.bare import (
    BareEnvd,
)
from bench.lifecycle.common import (
    KEEP_LOG_RE,
    PAUSE_HOT_S,
    RESULTS,
    SVG,
    Report,
    guarded,
    log,
)
from bench.lifecycle.create import (
    measure_create,
)
from bench.lifecycle.density import (
    measure_density,
)
from bench.lifecycle.first_command import measure_first_command
from bench.lifecycle.fork import (
    measure_fork,
)
from bench.lifecycle.idle_cpu import measure_idle_cpu
from bench.lifecycle.node import (
    PRECREATE_POOL,
    LifecycleNode,
    start_node,
    stop_lifecycle_node,
)
from bench.lifecycle.pause import (
    measure_pause,
)
from bench.lifecycle.report import (
    explain,
    markdown,
)
from bench.lifecycle.snapshot import (
    measure_snapshot,
)
from bench.lifecycle.svg import (
    svg,
)
from bench.node_bench.common import MIB, ms_since
from bench.node_bench.node import SERVER_LOG_LINES, sweep_slots

PARTS = ("create", "pause", "snapshot", "fork", "aging", "density", "idle_cpu", "command")


def fork_on_memory_node(report: Report, bare: BareEnvd, template: Path, runs: int) -> None:
    """Fork x16 on a second node with memory workspaces (started for this part, stopped
    after): there a fork's children are restored into pre-created sandboxes."""
    node = start_node("memory", "lifecycle-memory")
    try:
        measure_fork(report, node, bare, template, {16: runs}, prefix="memory_")
    finally:
        stop_lifecycle_node(node, report.errors)
        leaked = kill_leaked(node.server.home)
        if leaked:
            report.errors.append(f"memory node: killed {len(leaked)} leaked runsc processes")
        sweep_slots(*node.net_range, report.errors)


# -- main -------------------------------------------------------------------------------------


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per operation")
    parser.add_argument("--fork16-runs", type=int, default=5)
    parser.add_argument("--aging-runs", type=int, default=5)
    parser.add_argument("--aging-commands", type=int, default=1000)
    parser.add_argument("--density-children", type=int, default=16)
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds before memory")
    parser.add_argument(
        "--idle-cpu-window", type=float, default=20.0, help="seconds of idle CPU measured"
    )
    parser.add_argument(
        "--workspace",
        choices=("memory", "disk"),
        default=str(Settings.model_fields["workspace"].default),
        help="the node's workspace mode (default: the product's)",
    )
    parser.add_argument(
        "--fork-both-modes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run fork x16 on a second node with memory workspaces (whose forks use "
        "pre-created sandboxes from the first; disk-workspace forks only while the "
        "parent's files stay the same)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few runs of everything (development); writes *-quick files",
    )
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help="comma-separated subset of: " + ", ".join(PARTS),
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--svg", type=Path, default=None)
    args = parser.parse_args(argv)
    apply_quick(
        args,
        parser,
        {
            "runs": 3,
            "fork16_runs": 1,
            "aging_runs": 2,
            "aging_commands": 90,
            "density_children": 4,
            "idle": 2.0,
            "idle_cpu_window": 6.0,
        },
    )
    out = args.out or (RESULTS.with_name("lifecycle-quick.json") if args.quick else RESULTS)
    svg_path = args.svg or (out.with_suffix(".svg") if args.quick else SVG)
    only = set(args.only.split(","))

    signal.signal(signal.SIGTERM, _sigterm)
    load_before = warn_if_loaded(log)
    report = Report(
        meta={
            **measured_on(),
            "args": arg_strings(args),
            "loadavg_before": loadavg(load_before),
            "warm_pool_size": Settings.model_fields["warm_pool_size"].default,
            "precreate_pool_size": PRECREATE_POOL,
            "workspace": args.workspace,
            "pause_hot_s": PAUSE_HOT_S,
            "slot_base": os.environ["AENV_TEST_SLOT_BASE"],
        }
    )
    loads: dict[str, float] = {}
    started = time.perf_counter()
    node: LifecycleNode | None = None
    bare: BareEnvd | None = None
    try:
        node = start_node(args.workspace)
        probe = node.create()
        try:
            lowers = node.lowers(probe.sandbox_id)
        finally:
            probe.kill()
        bare = BareEnvd(
            lowers,
            Settings.model_fields["default_cpu_count"].default,
            Settings.model_fields["default_memory_mb"].default,
        )
        # The bare "template image": a booted envd sandbox, checkpointed once it listens
        # (what the node does at start for the base template).
        booted = bare.boot()
        _, template, size = bare.checkpoint(booted, leave_running=False)
        bare.delete(booted)
        report.sizes["bare_template_image_mib"] = round(size / MIB, 1)
        parts: list[tuple[str, Callable[[], None]]] = [
            ("create", lambda: measure_create(report, node, bare, template, args.runs)),
            ("pause", lambda: measure_pause(report, node, bare, template, args.runs)),
            (
                "snapshot",
                lambda: measure_snapshot(report, node, bare, template, [0, 10, 50], args.runs),
            ),
            (
                "fork",
                lambda: measure_fork(
                    report, node, bare, template, {1: args.runs, 4: args.runs, 16: args.fork16_runs}
                ),
            ),
            ("aging", lambda: measure_aging(report, node, args.aging_runs, args.aging_commands)),
            (
                "density",
                lambda: measure_density(
                    report, node, bare, template, args.density_children, args.idle
                ),
            ),
            ("idle_cpu", lambda: measure_idle_cpu(report, node, bare, args.idle_cpu_window)),
            ("command", lambda: measure_first_command(report, node, args.runs)),
        ]
        if "fork" in only and args.fork_both_modes and args.workspace != "memory":
            parts.append(
                (
                    "fork_memory",
                    lambda: fork_on_memory_node(report, bare, template, args.fork16_runs),
                )
            )
            only.add("fork_memory")
        for name, part in parts:
            if name not in only:
                continue
            node.wait_pool_full()
            loads[name] = os.getloadavg()[0]
            log(f"[{ms_since(started) / 1000:.0f} s] measuring {name} (load {loads[name]:.1f})")
            with guarded(report, name):
                part()
    finally:
        log(f"[{ms_since(started) / 1000:.0f} s] cleaning up")
        if bare is not None:
            bare.close()
        if node is not None:
            kept = [line for line in node.server.log().splitlines() if KEEP_LOG_RE.search(line)]
            stop_lifecycle_node(node, report.errors)
            leaked = kill_leaked(node.server.home)
            if leaked:
                report.errors.append(f"killed {len(leaked)} leaked runsc processes")
            SERVER_LOG_LINES["lifecycle"] = kept[-3000:]
            # Slots a node left prepared (its pool), swept by a node of the same range.
            sweep_slots(*node.net_range, report.errors)
    report.meta["loadavg_after"] = loadavg()
    report.meta["loadavg_during"] = loads
    report.meta["wall_s"] = round(ms_since(started) / 1000, 1)
    report.meta["server_log_lines"] = SERVER_LOG_LINES.get("lifecycle", [])
    explain(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    if report.rows:
        svg_path.parent.mkdir(parents=True, exist_ok=True)
        svg_path.write_text(svg(report))
    print(markdown(report))
    log(f"\nresults: {out}, plot: {svg_path}; {report.meta['wall_s']:.0f} s")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
