"""Disk workspaces: what a snapshot costs against bytes changed, not bytes held.

One node with ``workspace=disk`` (posix repository). Two rows, p50/p95 over ``--runs``:

- **changed**: one sandbox holds ``--held-mib`` MiB of files (snapshotted once first, so the
  next snapshots have a previous one to compare with); each run changes 10 MiB at a random
  offset, then ``create_snapshot()``;
- **fresh**: each run a new sandbox writes 10 MiB, then ``create_snapshot()`` (its first).

The issue's target: changed <= 1.5 x fresh. Also printed: chunks read / reused per snapshot
(the node's ``disk of … : N chunks read, M unchanged`` line). Results go to
``bench/results/workspace.json``; the numbers in docs/workspaces.md come from here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from e2b import Sandbox
from tests.conftest import free_port
from tests.server.harness import cleanup_home, client_env, kill_leaked, start_server

CHANGE_MIB = 10
CHUNKS_RE = r"for snapshot {sid}: (\d+) chunks read, (\d+) unchanged"
RESULTS = Path(__file__).parent / "results" / "workspace.json"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _snapshot(sbx: Sandbox, log: Callable[[], str]) -> tuple[float, int, int]:
    start = time.perf_counter()
    info = sbx.create_snapshot()
    took = (time.perf_counter() - start) * 1000
    found = None
    deadline = time.monotonic() + 10
    while found is None and time.monotonic() < deadline:
        found = re.search(CHUNKS_RE.format(sid=info.snapshot_id), log())
        time.sleep(0.05)
    read, reused = (int(found[1]), int(found[2])) if found else (-1, -1)
    Sandbox.delete_snapshot(info.snapshot_id)
    return took, read, reused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--held-mib", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="1 GiB held, 3 runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.held_mib = 3, 1024
    node = start_server(free_port(), workspace="disk", disk_size_mb=str(args.held_mib + 1024),
                        workspace_pool_bytes=str(64 << 30), warm_pool_size="0",
                        net_first_index="51000", net_last_index="51099")
    os.environ.update(client_env(node))
    rows: dict[str, dict[str, object]] = {}
    try:
        big = Sandbox.create(timeout=3600)
        big.commands.run(f"head -c {args.held_mib}M /dev/urandom > ~/held && sync", timeout=3600)
        _snapshot(big, node.log)  # the first reads everything; the next ones compare to it
        changed = []
        for _ in range(args.runs):
            at = random.randrange(0, max(1, args.held_mib - CHANGE_MIB))
            big.commands.run(f"dd if=/dev/urandom of=$HOME/held bs=1M count={CHANGE_MIB} "
                             f"seek={at} conv=notrunc status=none && sync")
            changed.append(_snapshot(big, node.log))
        big.kill()
        fresh = []
        for _ in range(args.runs):
            sbx = Sandbox.create(timeout=600)
            sbx.commands.run(f"head -c {CHANGE_MIB}M /dev/urandom > ~/new && sync")
            fresh.append(_snapshot(sbx, node.log))
            sbx.kill()
        for name, samples in (("changed", changed), ("fresh", fresh)):
            ms = [s[0] for s in samples]
            rows[name] = {"p50_ms": statistics.median(ms), "p95_ms": _pct(ms, 0.95),
                          "chunks_read": [s[1] for s in samples],
                          "chunks_reused": [s[2] for s in samples]}
        ratio = float(rows["changed"]["p50_ms"]) / float(rows["fresh"]["p50_ms"])  # type: ignore[arg-type]
        rows["ratio_p50"] = {"changed_over_fresh": ratio, "target": 1.5}
    finally:
        node.stop()
        kill_leaked(node.home)
        cleanup_home(node.home)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"held_mib": args.held_mib, "runs": args.runs, **rows},
                                  indent=1))
    sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
