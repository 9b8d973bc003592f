"""``python -m bench.torture [--minutes 30] [--sandboxes 50] [--clients 16] [--crashes 6]``:
the long form of the lifecycle torture against a node it starts (``make bench``); prints the
outcome of every kind of call and each violation, writes ``bench/results/torture.json``, and
exits non-zero on any violation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
from tests.server.harness import API_KEY
from tests.server.test_crash_lifecycle import crashable

from bench.torture import checks
from bench.torture.run import Plan, run
from bench.torture.world import World

RESULTS = Path(__file__).resolve().parents[1] / "results" / "torture.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sandboxes", type=int, default=50)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--crashes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    plan = Plan(
        seconds=args.minutes * 60,
        sandboxes=args.sandboxes,
        clients=args.clients,
        crashes=args.crashes,
        seed=args.seed,
    )
    # Room for the sandboxes and their fork children. Garbage collected every minute (the
    # default hour would keep every memory image of the run: tens of GB), racing the
    # pauses and snapshots as it would on a busy node.
    world: World | None = None
    try:
        with crashable(
            pause_hot_s="2",
            max_sandboxes=str(args.sandboxes * 3),
            gc_interval_s="60",
            gc_grace_s="120",
            repository_cache_bytes=str(4 << 30),
        ) as node:
            world = run(node, API_KEY, plan)
            # Repository blobs too: after a collection pass, none is left that no manifest
            # names (beyond the grace a commit in flight gets).
            r = httpx.post(f"{node.url}/repository/gc", headers={"X-API-KEY": API_KEY},
                           timeout=600)
            if r.status_code != 200:
                world.violate(f"repository gc: {r.status_code} {r.text[:200]}")
            for what in checks.unreferenced_blobs(node.home, older_than_s=130):
                world.violate(f"leak: {what}")
    except AssertionError as exc:
        # What the node left at its stop (runsc processes, mounts): a violation of the run,
        # reported with the rest instead of ending it without a report.
        if world is None:
            raise
        world.violate(f"leak at the node's stop: {exc}")
    text = checks.report(world)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "plan": vars(args),
                "sandboxes": len(world.sandboxes),
                "calls": sum(world.outcomes.values()),
                "kill_seconds": sorted(world.kill_seconds),
                "outcomes": {f"{op} {outcome}": n for (op, outcome), n in world.outcomes.items()},
                "violations": world.violations,
            },
            indent=1,
        )
    )
    return 1 if world.violations else 0


if __name__ == "__main__":
    sys.exit(main())
