"""The pre-created pool sized by demand (issue 26, docs/benchmarks.md "A pool sized by
demand"): waves of more sandboxes at once than the pool's floor, on a node whose pool stays at
the floor and on one with the product's defaults, where it grows to the demand
(``orchestrator/pool_demand.py``).

A wave is ``--count`` creates at once from one snapshot of a prepared parent (a trainer's
fan-out of rollouts; the official SDK forks at most 20 children per call), timed until every
sandbox answered ``commands.run("true")``; ``--waves`` of them, each started ``--gap`` seconds
after the previous wave's sandboxes were killed. Each node: the product's defaults (disk
workspaces) but for ``precreate_pool_max``. Reported per wave: its time and how many sandboxes
came from the pre-created pool; next to the bare runtime's ``--count`` restores into
sandboxes ``runsc create``d beforehand + an exec each, measured in the same run.

Writes bench/results/demand.json (and a markdown table on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40900")

from tests.server.harness import kill_leaked

from aenv.core.settings import Settings
from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, loadavg, measured_on
from bench.lifecycle.bare import BareEnvd, rm_image
from bench.lifecycle.common import log, run_true
from bench.lifecycle.fork import bare_fork
from bench.lifecycle.node import start_node, stop_lifecycle_node
from bench.node_bench.node import sweep_slots
from bench.waves_bench import fork_waves, wave_summary

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "demand.json"
FLOOR = int(Settings.model_fields["precreate_pool_size"].default)
CEILING = int(Settings.model_fields["precreate_pool_max"].default)


def _node_waves(name: str, ceiling: int, args: argparse.Namespace, errors: list[str]
                ) -> tuple[dict[str, Any], list[Path]]:
    """The node's waves, and the base template's layers (for the bare sandboxes)."""
    node = start_node("disk", name, precreate_pool_max=str(ceiling))
    try:
        parent = node.create()
        lowers = node.lowers(parent.sandbox_id)
        parent.files.write("/home/user/prepared", "the parent's setup")
        run_true(parent)
        snapshot = parent.create_snapshot()
        parent.kill()
        waves = fork_waves(node, parent, args.waves, args.gap, name,
                           snapshot_id=snapshot.snapshot_id, count=args.count)
        kept = [line for line in node.server.log().splitlines()
                if "pre-created pool: keeping" in line]
        later = waves[1:]  # the first wave finds none of the snapshot's shape
        return {"precreate_pool_max": ceiling, "waves": waves, **wave_summary(later),
                "first_ms": waves[0]["all_ms"], "pool_sizes_logged": len(kept)}, lowers
    finally:
        stop_lifecycle_node(node, errors)
        if kill_leaked(node.server.home):
            errors.append(f"{name}: killed leaked runsc processes")
        sweep_slots(*node.net_range, errors)


def _bare(args: argparse.Namespace, lowers: list[Path]) -> list[float]:
    bare = BareEnvd(lowers, Settings.model_fields["default_cpu_count"].default,
                    Settings.model_fields["default_memory_mb"].default)
    template: Path | None = None
    try:
        booted = bare.boot()
        _, template, _size = bare.checkpoint(booted, leave_running=False)
        bare.delete(booted)
        parent, _ = bare.restore(template)
        bare.exec(parent, "/bin/true")
        # The bare fork's restores and execs, without its checkpoint.
        runs = [all_ms - ckpt_ms for ckpt_ms, all_ms in
                (bare_fork(bare, parent, args.count, precreated=True)
                 for _ in range(args.bare_waves))]
        bare.delete(parent)
        return runs
    finally:
        bare.close()
        if template is not None:
            rm_image(template)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=32, help="children per fork")
    parser.add_argument("--waves", type=int, default=6)
    # A rollout's time, during which the pool refills: at 3 s (waves_bench's) it makes ~16
    # between waves whatever its size, so no size can show.
    parser.add_argument("--gap", type=float, default=8.0,
                        help="seconds between a wave's kill and the next wave")
    parser.add_argument("--bare-waves", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    apply_quick(args, parser, {"count": 20, "waves": 3, "bare_waves": 1})
    load = warn_if_loaded(log)
    result: dict[str, Any] = {**measured_on(), "args": arg_strings(args),
                              "loadavg_before": loadavg(load)}
    errors: list[str] = []
    result["fixed"], lowers = _node_waves("fixed", FLOOR, args, errors)
    time.sleep(args.gap)
    result["by_demand"], _ = _node_waves("by-demand", CEILING, args, errors)
    bare = _bare(args, lowers)
    result["bare"] = {"all_ms": bare, "p50_ms": statistics.median(bare)}
    for key in ("fixed", "by_demand"):
        result[key]["ratio_to_bare_p50"] = round(result[key]["p50_ms"] / statistics.median(bare),
                                                 3)
    result["errors"] = errors
    out = RESULTS.with_name("demand-quick.json") if args.quick else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result, args)


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n{args.count} creates from a snapshot at once, {args.waves} waves {args.gap:g} s "
          f"apart; bare: {args.count} restores into pre-created + exec, p50 "
          f"{result['bare']['p50_ms']:.0f} ms")
    print("\n| pool | first wave (ms) | waves 2+: p50 / max (ms) | pre-created per wave "
          "(2+, mean) | ratio to bare (p50) |")
    print("|---|---:|---:|---:|---:|")
    for key, label in (("fixed", f"fixed at {FLOOR}"),
                       ("by_demand", f"by demand, {FLOOR}-{CEILING}")):
        r = result[key]
        print(f"| {label} | {r['first_ms']:.0f} | {r['p50_ms']:.0f} / {r['max_ms']:.0f} | "
              f"{r['mean_precreated']:.1f} of {args.count} | {r['ratio_to_bare_p50']:.2f}x |")
    if result["errors"]:
        print("\nerrors:", *result["errors"], sep="\n- ")


if __name__ == "__main__":
    main()
