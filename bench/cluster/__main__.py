"""``python -m bench.cluster``: the cluster benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("AENV_TEST_SLOT_BASE", "48000")

from tests.cluster.layout import cluster_layout

from bench.cli_args import apply_quick, warn_if_loaded
from bench.cluster import latency, placement, throughput
from bench.cluster.common import log

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cluster.json"
#: Per node: room for a whole burst on one node, so both bursts measure speed, not refusals.
LIMIT = "64"


def table(result: dict) -> str:
    lines = ["| measurement | n | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
    for part in ("latency", "placement"):
        for name, row in result[part]["rows"].items():
            lines.append(f"| {name} | {row['n']} | {row['p50']} | {row['p95']} |")
    lines.append("")
    lines.append("| ratio | p50 over p50 |")
    lines.append("|---|---:|")
    for part in ("latency", "placement"):
        for name, value in result[part]["ratio"].items():
            lines.append(f"| {name} | {value} |")
    lines.append("")
    lines.append("| nodes | creates | s | creates/s | 429 retried | p50 ms | p95 ms |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|")
    for row in result["throughput"]:
        lat = row["latency_ms"]
        lines.append(f"| {row['nodes']} | {row['creates']} | {row['seconds']} | "
                     f"{row['creates_per_s']} | {row['retried_429']} | {lat['p50']} | "
                     f"{lat['p95']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=300, help="samples per latency row")
    parser.add_argument("--creates", type=int, default=48, help="creates per burst")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small numbers (CI)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    apply_quick(args, parser, {"rounds": 30, "creates": 6, "concurrency": 3})
    load = warn_if_loaded(log)
    started = time.time()
    result: dict = {"load_before": load, "started": started}
    with cluster_layout(nodes=3, max_sandboxes=LIMIT, warm_pool_size="2") as layout:
        log("layout up: 3 nodes, 2 schedulers, 2 gateways")
        result["latency"] = latency.measure(layout, args.rounds)
        result["placement"] = placement.measure(layout, args.rounds)
        result["throughput"] = [throughput.burst(layout, args.creates, args.concurrency)]
    with cluster_layout(nodes=1, max_sandboxes=LIMIT, warm_pool_size="2") as layout:
        result["throughput"].append(throughput.burst(layout, args.creates, args.concurrency))
    three, one = result["throughput"]
    result["creates_per_s_3_over_1"] = round(three["creates_per_s"] / one["creates_per_s"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\ncreates/s, 3 nodes over 1: {result['creates_per_s_3_over_1']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
