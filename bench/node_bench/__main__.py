"""``python -m bench.node_bench``: start the nodes, run the selected parts, write the results."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import bench.node_bench
from aenv.core.settings import Settings
from bench.cli_args import LOAD_WARN
from bench.header import arg_strings, loadavg, measured_on
from bench.node_bench.bare import BareRunsc, template_rootfs
from bench.node_bench.common import RESULTS, Report
from bench.node_bench.concurrency import measure_concurrent
from bench.node_bench.create import measure_create
from bench.node_bench.memory import measure_memory
from bench.node_bench.node import SERVER_LOG_LINES, nodes_running, server_has_setting, stop_node
from bench.node_bench.report import evaluate_targets, markdown
from bench.node_bench.round_trip import measure_round_trip


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts, write the JSON, print the markdown; 1 if something broke."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.node_bench",
        description=(bench.node_bench.__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--create-runs", type=int, default=20, help="timed create rounds")
    parser.add_argument("--rt-runs", type=int, default=50, help="timed round trips per row")
    parser.add_argument("--rt-warmup", type=int, default=5)
    parser.add_argument("--loop", type=int, default=20, help="spawns per in-sandbox loop")
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--memory-sandboxes", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds before memory")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-pool node")
    parser.add_argument(
        "--only",
        default="create,rt,concurrent,memory",
        help="comma-separated subset of: create, rt, concurrent, memory",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    only = set(args.only.split(","))

    load_before = os.getloadavg()
    if load_before[0] > LOAD_WARN:
        print(
            f"warning: 1-minute load average is {load_before[0]:.2f} on {os.cpu_count()} CPUs; "
            "something else is running and the numbers will be noisy",
            file=sys.stderr,
        )
    report = Report(
        meta={
            **measured_on(),  # after argparse: --help should not pay for the SDK import
            "args": arg_strings(args),
            "loadavg_before": loadavg(load_before),
            "server_settings": {
                "warm_pool_size": Settings.model_fields["warm_pool_size"].default
                if server_has_setting("warm_pool_size")
                else None,
                "default_cpu_count": Settings.model_fields["default_cpu_count"].default,
                "default_memory_mb": Settings.model_fields["default_memory_mb"].default,
            },
        }
    )
    loads: list[float] = []
    warm = not args.no_warm and "create" in only
    with nodes_running(warm) as nodes:
        cold = nodes[0]
        report.meta["nodes"] = {n.name: {"warm_pool_size": n.warm_pool} for n in nodes}
        if "create" in only:
            probe = cold.create()
            try:
                rootfs = template_rootfs(cold, probe.sandbox_id)
            finally:
                probe.kill()
            bare = BareRunsc(
                rootfs,
                Settings.model_fields["default_cpu_count"].default,
                Settings.model_fields["default_memory_mb"].default,
            )
            print(
                f"measuring create ({', '.join(n.name for n in nodes)}, bare) ...", file=sys.stderr
            )
            try:
                loads.append(os.getloadavg()[0])
                measure_create(report, nodes, bare, args.create_runs)
            finally:
                bare.close()
            for extra in nodes[1:]:  # idle warm sandboxes would only add noise below
                stop_node(extra, report.errors)
            del nodes[1:]
        if "rt" in only:
            print("measuring round trips ...", file=sys.stderr)
            loads.append(os.getloadavg()[0])
            measure_round_trip(report, cold, args.rt_runs, args.rt_warmup, args.loop)
        if "concurrent" in only:
            print(f"measuring {args.concurrent} concurrent creates ...", file=sys.stderr)
            loads.append(os.getloadavg()[0])
            measure_concurrent(report, cold, args.concurrent)
        if "memory" in only:
            print(
                f"measuring idle memory of {args.memory_sandboxes} sandboxes ...", file=sys.stderr
            )
            loads.append(os.getloadavg()[0])
            measure_memory(report, cold, args.memory_sandboxes, args.idle)
    report.meta["loadavg_after"] = loadavg()
    report.meta["server_log_lines"] = SERVER_LOG_LINES
    report.meta["loadavg_during"] = loads
    evaluate_targets(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    print(markdown(report))
    print(f"\nresults: {args.out}", file=sys.stderr)
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
