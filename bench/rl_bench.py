"""RL rollout cost benchmark (issue 12, ``aenv bench rl``): one rollout workload run three
ways, and what each costs in environment-seconds, memory GB-hours and disk.

The workload (``bench/rl/workload.py``): ``--tasks`` tasks, each with a real setup step (a
generated Python package of ``--files`` modules, a venv with the ``--deps`` installed by pip
from real wheels, the package installed into it, byte-compiled, committed to git, its suite
run once), then ``--group`` rollouts per task, each four agent
commands and an edit, scored by the test suite. The modes (``bench/rl/modes.py``): ``cold``
(a fresh sandbox and the full setup per episode), ``template`` (the setup once per task,
snapshotted; episodes created from the snapshot, no fork), ``fork`` (``aenv.rl.RolloutPool``:
prepared once per task, rollouts forked in waves, finished ones killed, or paused with
``--keep``). The
meters (``bench/rl/meter.py``) are described there; every mode runs at most ``--parallel``
agents at once.

Without ``E2B_API_URL`` each mode gets a fresh node of its own, started one after the other
through ``tests/server/harness.py`` (so each mode's disk is its own); with it, all modes run
on that node, one after the other (no disk figure: its home is not known here).
Writes ``--out`` (JSON) and ``--svg``, prints a markdown table (docs/benchmarks.md, "RL
rollouts: cost (issue 12)").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40000")

from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import loadavg, machine, utc_now
from bench.rl.meter import Ledger, MeteredClient, Sampler
from bench.rl.modes import MODES, RUNNERS
from bench.rl.report import markdown, reductions, svg
from bench.rl.wheelhouse import DEPENDENCIES, wheels
from bench.rl.workload import FILES, task

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "rl.json"
SVG = REPO / "docs" / "img" / "rl.svg"
#: Agents at once: two per core here; more only queues in the sandboxes, and makes every
#: sandbox live longer for the same work (each mode alike).
PARALLEL = 4
#: After a node starts: its slot pool fills before the first create is timed.
SETTLE_S = 2.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def node(errors: list[str]) -> Iterator[Path | None]:
    """The node to run on: ``E2B_API_URL``'s (home unknown) or a fresh harness node; the
    tracebacks its log shows by the end of the mode go to ``errors`` (the harness removes
    the home, and the log with it, when the node stops)."""
    if os.environ.get("E2B_API_URL"):
        yield None
        return
    from tests.server.harness import serving

    with serving() as server:
        time.sleep(SETTLE_S)
        try:
            yield server.home
        finally:
            lines = server.log().splitlines()
            for i, line in enumerate(lines):
                if line.startswith("Traceback"):
                    errors.append("\n".join(lines[max(0, i - 3) : i + 40]))


def requirements(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(r for r in args.deps.replace(",", " ").split() if r != "none")


async def run_mode(
    name: str, args: argparse.Namespace, home: Path | None, wheelhouse: dict[str, bytes]
) -> dict[str, Any]:
    tasks = [task(i, args.files, wheelhouse, requirements(args)) for i in range(args.tasks)]
    ledger = Ledger()
    sampler = Sampler(ledger, home)
    sampler.start()
    start = time.monotonic()
    try:
        async with MeteredClient(ledger, run_id=f"rl-bench-{name}-{os.getpid()}") as client:
            options = {"branch_from": args.branch_from} if name == "fork" else {}
            rewards = await RUNNERS[name](client, tasks, args.group, args.parallel, args.keep,
                                          **options)
    finally:
        wall = time.monotonic() - start
        memory = sampler.stop()
    episodes = len(rewards)
    scored = [r for r in rewards if r is not None]
    return {
        "episodes": episodes,
        "wall_s": round(wall, 2),
        "episodes_per_h": round(episodes / wall * 3600, 1),
        "mean_reward": round(sum(scored) / len(scored), 3) if scored else None,
        **ledger.totals(),
        **memory,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=16, help="rollouts per task (G)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--parallel", type=int, default=PARALLEL, help="agents at once")
    parser.add_argument("--files", type=int, default=FILES, help="modules per task's package")
    parser.add_argument(
        "--deps",
        default=" ".join(DEPENDENCIES),
        help="the repository's dependencies, pip-installed by the setup ('none': no install)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--svg", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="fork: pause finished rollouts")
    parser.add_argument("--quick", action="store_true", help="1 task, G=4")
    parser.add_argument("--branch-from", choices=("snapshot", "parent"), default="snapshot",
                        help="fork: rollouts from a snapshot of the paused parent, or forks "
                        "of the running parent")
    args = parser.parse_args(argv)
    apply_quick(args, parser, {"tasks": 1, "group": 4})
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    log(f"wheelhouse: {' '.join(requirements(args)) or 'no dependencies'}")
    wheelhouse = wheels(requirements(args))
    log(
        f"wheelhouse: {len(wheelhouse)} wheels, "
        f"{sum(map(len, wheelhouse.values())) / 2**20:.1f} MiB"
    )
    load_before = warn_if_loaded(log)
    results: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for name in modes:
        log(f"mode {name}: {args.tasks} tasks x {args.group} rollouts, {args.parallel} at once")
        with node(errors) as home:
            results[name] = asyncio.run(run_mode(name, args, home, wheelhouse))
        brief = {k: v for k, v in results[name].items() if k != "by_role"}
        log(f"mode {name}: {json.dumps(brief)}")
    report = {
        "meta": {
            "date": utc_now(),
            "machine": machine(),
            "tasks": args.tasks,
            "group": args.group,
            "parallel": args.parallel,
            "files": args.files,
            "dependencies": list(requirements(args)),
            "keep": args.keep,
            "node": os.environ.get("E2B_API_URL") or "a fresh harness node per mode",
            "argv": sys.argv[1:] if argv is None else argv,
            "loadavg_before": loadavg(load_before),
            "loadavg_after": loadavg(),
        },
        "modes": results,
        "reductions": reductions(results),
        "errors": errors,
    }
    out = args.out or (RESULTS.with_name("rl-quick.json") if args.quick else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if args.svg is not None:
        args.svg.parent.mkdir(parents=True, exist_ok=True)
        args.svg.write_text(svg(report))
    print(markdown(report))
    for error in errors:
        log(f"node log:\n{error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
