"""Speed that holds wave after wave (issue 26, docs/benchmarks.md "Waves"): what an RL trainer
that forks again and again gets, not one good wave.

One real node with the product's defaults (disk workspaces, the default pools), through the
official SDK:

* **paced**: ``--waves`` waves of fork x16 of one prepared parent, each wave started
  ``--gap`` seconds after the previous wave's children were killed (about one rollout here);
  a wave's time runs from the fork call until every child answered ``commands.run("true")``.
* **back to back**: the same with no pause between the waves.
* **from a snapshot**: ``--waves`` paced waves of 16 creates from one snapshot of the parent
  (what an RL group can use instead of a fork: the snapshot's disk image stays, so the
  pre-created pool keeps sandboxes of its shape), each until its first command answered; next
  to the bare 16 restores into pre-created sandboxes + exec (the bare fork's time without its
  checkpoint).
* **burst**: ``--burst`` creates at once, until every sandbox answered a command.

Every wave is reported, with how many children came from the pre-created pool, next to the
bare runtime's equivalent measured in the same run: a checkpoint of a running envd sandbox
(``--leave-running``), 16 restores into sandboxes ``runsc create``d beforehand and an exec in
each (``bench/lifecycle/bare.py``); for the burst, as many restores of the template image at
once with an exec each.

Writes bench/results/waves.json (and a markdown table on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40900")

from tests.server.harness import kill_leaked

from aenv.core.settings import Settings
from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, loadavg, measured_on
from bench.lifecycle.bare import BareEnvd, rm_image
from bench.lifecycle.common import kill_all, log, run_true
from bench.lifecycle.fork import bare_fork, fork_phases
from bench.lifecycle.node import LifecycleNode, start_node, stop_lifecycle_node
from bench.node_bench.common import ms_since
from bench.node_bench.node import sweep_slots

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "waves.json"
FORK_COUNT = 16


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fork_wave(node: LifecycleNode, parent: Any, count: int = FORK_COUNT) -> dict[str, Any]:
    """One fork x``count`` until every child answered; its children killed after (untimed)."""
    start = time.perf_counter()
    children = parent.fork(count=count, timeout=600, request_timeout=300)
    call_ms = ms_since(start)
    kids = [c for c in children if not isinstance(c, Exception)]
    try:
        if len(kids) != count:
            raise RuntimeError(f"{count - len(kids)} fork children failed: "
                               f"{next(c for c in children if isinstance(c, Exception))!r}")
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(run_true, kids))
        all_ms = ms_since(start)
        created = node.created()
        pre = sum(int(created.get(k.sandbox_id, {}).get("from_precreated", 0)) for k in kids)
    finally:
        kill_all(kids)
    return {"call_ms": call_ms, "all_ms": all_ms, "precreated": pre,
            "children": [k.sandbox_id for k in kids]}


def snapshot_wave(node: LifecycleNode, snapshot_id: str, count: int = FORK_COUNT
                  ) -> dict[str, Any]:
    """``count`` creates from ``snapshot_id`` at once, until each answered; killed after
    (untimed)."""
    def one(_: int) -> Any:
        sandbox = node.create(template=snapshot_id)
        run_true(sandbox)
        return sandbox

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        kids = list(pool.map(one, range(count)))
    all_ms = ms_since(start)
    try:
        created = node.created()
        pre = sum(int(created.get(k.sandbox_id, {}).get("from_precreated", 0)) for k in kids)
    finally:
        kill_all(kids)
    return {"call_ms": all_ms, "all_ms": all_ms, "precreated": pre,
            "children": [k.sandbox_id for k in kids]}


def fork_waves(node: LifecycleNode, parent: Any, waves: int, gap_s: float, name: str,
               snapshot_id: str | None = None, count: int = FORK_COUNT
               ) -> list[dict[str, Any]]:
    out = []
    for i in range(waves):
        if i and gap_s:
            time.sleep(gap_s)
        wave = (fork_wave(node, parent, count) if snapshot_id is None
                else snapshot_wave(node, snapshot_id, count))
        out.append(wave)
        log(f"  {name} wave {i + 1}/{waves}: all answered {wave['all_ms']:.0f} ms "
            f"(call {wave['call_ms']:.0f}; {wave['precreated']:.0f} of {count} "
            "pre-created)")
    return out


def _burst(node: LifecycleNode, count: int) -> dict[str, float]:
    """``count`` creates at once, each until its first command answered. The node's
    admission answers what it cannot queue with 429 and a ``retry in`` hint; each create is
    tried again after it, as a client that wants all of them does (counted)."""
    from e2b.exceptions import RateLimitException

    refused = [0]

    def one(_: int) -> tuple[Any, float]:
        began = time.perf_counter()
        while True:
            try:
                sandbox = node.create()
                break
            except RateLimitException:
                refused[0] += 1
                time.sleep(0.25)
        run_true(sandbox)
        return sandbox, ms_since(began)

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        made = list(pool.map(one, range(count)))
    all_ms = ms_since(start)
    kill_all([s for s, _ in made])
    each = [ms for _, ms in made]
    return {"all_ms": all_ms, "p50_ms": _pct(each, 0.5), "p95_ms": _pct(each, 0.95),
            "refused_429": refused[0]}


def _bare_burst(bare: BareEnvd, template: Path, count: int) -> float:
    def one(_: int) -> str:
        cid, _ms = bare.restore(template)
        bare.exec(cid, "/bin/true")
        return cid

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        cids = list(pool.map(one, range(count)))
    all_ms = ms_since(start)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(bare.delete, cids))
    return all_ms


def wave_summary(waves: list[dict[str, Any]]) -> dict[str, float]:
    times = [w["all_ms"] for w in waves]
    return {"p50_ms": _pct(times, 0.5), "p95_ms": _pct(times, 0.95), "max_ms": max(times),
            "mean_precreated": statistics.fmean(w["precreated"] for w in waves)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--gap", type=float, default=3.0,
                        help="seconds between a wave's kill and the next wave (paced)")
    parser.add_argument("--bare-waves", type=int, default=5)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    apply_quick(args, parser, {"waves": 3, "bare_waves": 2, "burst": 16})
    load = warn_if_loaded(log)
    result: dict[str, Any] = {**measured_on(), "args": arg_strings(args),
                              "loadavg_before": loadavg(load)}
    node = start_node("disk", "waves")
    bare: BareEnvd | None = None
    template: Path | None = None
    errors: list[str] = []
    try:
        probe = node.create()
        try:
            lowers = node.lowers(probe.sandbox_id)
        finally:
            probe.kill()
        bare = BareEnvd(lowers, Settings.model_fields["default_cpu_count"].default,
                        Settings.model_fields["default_memory_mb"].default)
        booted = bare.boot()
        _, template, _size = bare.checkpoint(booted, leave_running=False)
        bare.delete(booted)

        parent = node.create()
        run_true(parent)
        bare_parent, _ = bare.restore(template)
        bare.exec(bare_parent, "/bin/true")
        fork_wave(node, parent)  # warm-up: the pre-created pool takes the fork's shape
        time.sleep(args.gap)
        paced = fork_waves(node, parent, args.waves, args.gap, "paced")
        time.sleep(args.gap)
        back = fork_waves(node, parent, args.waves, 0.0, "back-to-back")
        time.sleep(args.gap)
        snapshot = parent.create_snapshot()
        snapshot_wave(node, snapshot.snapshot_id)  # warm-up: the pool takes its shape
        time.sleep(args.gap)
        from_snapshot = fork_waves(node, parent, args.waves, args.gap, "from a snapshot",
                               snapshot_id=snapshot.snapshot_id)
        bare_runs = [bare_fork(bare, bare_parent, FORK_COUNT, precreated=True)
                     for _ in range(args.bare_waves)]
        bare_all = [all_ms for _, all_ms in bare_runs]
        bare_ckpt = [ckpt for ckpt, _ in bare_runs]
        bare_restores = [all_ms - ckpt for ckpt, all_ms in bare_runs]
        log(f"  bare: checkpoint + {FORK_COUNT} restores into pre-created + exec: "
            f"{statistics.median(bare_all):.0f} ms p50")
        parent.kill()
        bare.delete(bare_parent)
        time.sleep(args.gap)
        burst = _burst(node, args.burst)
        bare_burst = _bare_burst(bare, template, args.burst)
        log(f"  burst of {args.burst}: {burst['all_ms']:.0f} ms (bare {bare_burst:.0f} ms)")
        bare_p50 = statistics.median(bare_all)
        result.update({
            # Where a child's time goes (the node's "created" phases), over every wave.
            "child_phases": fork_phases(node, [w.pop("children") for w in paced + back]),
            "snapshot_child_phases": fork_phases(
                node, [w.pop("children") for w in from_snapshot]),
            "paced": {"gap_s": args.gap, "waves": paced, **wave_summary(paced)},
            "back_to_back": {"waves": back, **wave_summary(back),
                             "ratio_to_bare_p50": round(wave_summary(back)["p50_ms"] / bare_p50,
                                                        3)},
            "bare_fork16": {"p50_ms": bare_p50, "all_ms": bare_all,
                            "checkpoint_p50_ms": statistics.median(bare_ckpt),
                            "restores_p50_ms": statistics.median(bare_restores)},
            "from_snapshot": {"gap_s": args.gap, "waves": from_snapshot,
                              **wave_summary(from_snapshot),
                              "ratio_to_bare_restores_p50": round(
                                  wave_summary(from_snapshot)["p50_ms"]
                                  / statistics.median(bare_restores), 3)},
            "burst": {"count": args.burst, **burst, "bare_all_ms": bare_burst,
                      "ratio_to_bare": round(burst["all_ms"] / bare_burst, 3)},
            "targets": {"paced_p50_ms": 1500, "paced_max_ms": 2000,
                        "back_to_back_ratio_to_bare": 1.3},
        })
    finally:
        if bare is not None:
            bare.close()
        if template is not None:
            rm_image(template)
        stop_lifecycle_node(node, errors)
        if kill_leaked(node.server.home):
            errors.append("killed leaked runsc processes")
        sweep_slots(*node.net_range, errors)
    result["errors"] = errors
    out = RESULTS.with_name("waves-quick.json") if args.quick else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)


def _print(result: dict[str, Any]) -> None:
    if "paced" not in result:
        print(f"no result: {result.get('errors')}", file=sys.stderr)
        return
    print("| wave | paced: all answered | pre-created | back to back | pre-created |")
    print("|---|---|---|---|---|")
    for i, (p, b) in enumerate(zip(result["paced"]["waves"], result["back_to_back"]["waves"],
                                   strict=True), start=1):
        print(f"| {i} | {p['all_ms']:.0f} ms | {p['precreated']:.0f} | {b['all_ms']:.0f} ms | "
              f"{b['precreated']:.0f} |")
    paced, back, bare = result["paced"], result["back_to_back"], result["bare_fork16"]
    snap = result["from_snapshot"]
    print("\n| wave | 16 creates from a snapshot | pre-created |\n|---|---|---|")
    for i, w in enumerate(snap["waves"], start=1):
        print(f"| {i} | {w['all_ms']:.0f} ms | {w['precreated']:.0f} |")
    print(f"\nfrom a snapshot p50 {snap['p50_ms']:.0f} ms, max {snap['max_ms']:.0f} ms = "
          f"{snap['ratio_to_bare_restores_p50']:.2f}x the bare 16 restores into pre-created "
          f"+ exec ({bare['restores_p50_ms']:.0f} ms)")
    print(f"\npaced p50 {paced['p50_ms']:.0f} ms, max {paced['max_ms']:.0f} ms; back to back "
          f"p50 {back['p50_ms']:.0f} ms = {back['ratio_to_bare_p50']:.2f}x the bare "
          f"{bare['p50_ms']:.0f} ms; burst of {result['burst']['count']}: "
          f"{result['burst']['all_ms']:.0f} ms = {result['burst']['ratio_to_bare']:.2f}x bare")


if __name__ == "__main__":
    main()
