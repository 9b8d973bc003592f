"""``python -m bench.torture [--minutes 30] [--sandboxes 50] [--clients 16] [--crashes 6]``:
the long form of the lifecycle torture against a node it starts (``make bench``); prints the
outcome of every kind of call and each violation, writes ``bench/results/torture.json``, and
exits non-zero on any violation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.server.harness import API_KEY
from tests.server.test_crash_lifecycle import crashable

from bench.torture import checks
from bench.torture.run import Plan, run

RESULTS = Path(__file__).resolve().parents[1] / "results" / "torture.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sandboxes", type=int, default=50)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--crashes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=21)
    args = parser.parse_args()
    plan = Plan(seconds=args.minutes * 60, sandboxes=args.sandboxes, clients=args.clients,
                crashes=args.crashes, seed=args.seed)
    # Room for the sandboxes and their fork children.
    with crashable(pause_hot_s="2", max_sandboxes=str(args.sandboxes * 3)) as node:
        world = run(node, API_KEY, plan)
    text = checks.report(world)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "plan": vars(args), "sandboxes": len(world.sandboxes),
        "calls": sum(world.outcomes.values()), "kill_seconds": sorted(world.kill_seconds),
        "outcomes": {f"{op} {outcome}": n for (op, outcome), n in world.outcomes.items()},
        "violations": world.violations}, indent=1))
    return 1 if world.violations else 0


if __name__ == "__main__":
    sys.exit(main())
