"""Snapshot repository benchmark (issue 10): commit and fetch throughput on both backends next to
a plain ``obstore`` put / get of the same bytes, pause and resume from disk with an S3
repository next to the default posix_fs one, and what a snapshot costs against bytes written.

Starts a real S3 server (moto, ``tests/s3.py``) and, for parts 2 and 3, two node servers with
``AENV_PAUSE_HOT_S=0`` and no warm pool: one on ``s3://aenv-test/node`` on that server, one
on its default ``<home>/repository`` (see ``bench/repository/common.py``; their network slots
are 49600-49799, a range no other benchmark uses):

1. ``storage``: ``SnapshotRepository.commit`` / ``materialize`` of 16, 64, 256 MiB memory
   images, posix_fs and S3, next to ``obstore`` put / get (``bench/repository/storage.py``).
2. ``pause``: pause → written to disk → published, and resume, for a sandbox that wrote 0 and
   64 MiB, S3 next to posix_fs (``bench/repository/pause.py``).
3. ``cost``: ``create_snapshot()`` time and bytes added to the repository for 0, 16, 64,
   256 MiB written, and 64 MiB written then 1 MiB changed (``bench/repository/cost.py``).

Writes bench/results/repository.json, docs/img/repository.svg (p50 bars, p95 whiskers, bare p50
as a grey diamond) and prints a markdown report (copied into docs/benchmarks.md). The exit
status is non-zero only when something failed or a node logged a traceback.
"""

from __future__ import annotations

import os

# Before anything imports lifecycle_bench (which defaults the slot base to its own range).
os.environ.setdefault("AENV_TEST_SLOT_BASE", "48000")

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.s3 import run_s3_server
from tests.server.harness import kill_leaked

from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, environment, load_line, loadavg, measured_on
from bench.lifecycle_bench import Report, guarded, log, svg
from bench.node_bench.common import ms_since
from bench.node_bench.node import SERVER_LOG_LINES, stop_node, sweep_slots
from bench.repository.common import BACKENDS, RepoNode, markdown, start_repo_node
from bench.repository.cost import measure_cost
from bench.repository.pause import measure_pause
from bench.repository.storage import SIZES_MIB, measure_storage

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "repository.json"
SVG = REPO / "docs" / "img" / "repository.svg"
PARTS = ("storage", "pause", "cost")


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def header(report: Report) -> str:
    meta = report.meta
    return (
        f"{environment(meta)}, moto {meta['moto']} and the nodes on the same machine. "
        f"Nodes: no warm pool, `AENV_PAUSE_HOT_S=0`. {load_line(meta)}. "
        f"Wall time {meta['wall_s']:.0f} s."
    )


def plot(report: Report) -> str:
    """lifecycle_bench's plot, titled for this benchmark."""
    return (
        svg(report)
        .replace(">aenv lifecycle operations:", ">aenv snapshot repository:")
        .replace("target (red), ", "")
        .replace(
            "Children of a fork are restored concurrently on 2 shared vCPUs.",
            "Bare: plain obstore put/get of the same bytes; pause rows: posix_fs repository.",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed commits/fetches per size")
    parser.add_argument("--pause-runs", type=int, default=10, help="pause/resume cycles")
    parser.add_argument("--cost-runs", type=int, default=5, help="snapshots per size")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES_MIB)), help="storage part: image sizes in MiB"
    )
    parser.add_argument("--quick", action="store_true", help="few runs (development)")
    parser.add_argument("--only", default=",".join(PARTS), help="subset of: " + ", ".join(PARTS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--svg", type=Path, default=None)
    args = parser.parse_args(argv)
    apply_quick(args, parser, {"runs": 1, "pause_runs": 2, "cost_runs": 1, "sizes": "16"})
    out = args.out or (RESULTS.with_name("repository-quick.json") if args.quick else RESULTS)
    svg_path = args.svg or (out.with_suffix(".svg") if args.quick else SVG)
    only = set(args.only.split(","))
    sizes = tuple(int(s) for s in args.sizes.split(","))

    import moto

    signal.signal(signal.SIGTERM, _sigterm)
    load_before = warn_if_loaded(log)
    report = Report(
        meta={
            **measured_on(),
            "moto": getattr(moto, "__version__", "?"),
            "args": arg_strings(args),
            "loadavg_before": loadavg(load_before),
        }
    )
    loads: dict[str, float] = {}
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    nodes: dict[str, RepoNode] = {}
    try:
        with run_s3_server() as s3:

            def node_parts(part: Callable[[], None]) -> Callable[[], None]:
                def run() -> None:
                    for backend in BACKENDS:
                        if backend not in nodes:
                            nodes[backend] = start_repo_node(backend, s3)
                    part()

                return run

            parts: list[tuple[str, Callable[[], None]]] = [
                ("storage", lambda: measure_storage(report, s3, scratch, args.runs, sizes)),
                ("pause", node_parts(lambda: measure_pause(report, nodes, args.pause_runs))),
                ("cost", node_parts(lambda: measure_cost(report, nodes, args.cost_runs))),
            ]
            try:
                for name, part in parts:
                    if name not in only:
                        continue
                    loads[name] = os.getloadavg()[0]
                    log(
                        f"[{ms_since(started) / 1000:.0f} s] measuring {name} "
                        f"(load {loads[name]:.1f})"
                    )
                    with guarded(report, name):
                        part()
                log(f"[{ms_since(started) / 1000:.0f} s] cleaning up")
            finally:
                for node in nodes.values():
                    stop_node(node, report.errors)
                    leaked = kill_leaked(node.server.home)
                    if leaked:
                        report.errors.append(f"killed {len(leaked)} leaked runsc processes")
                    sweep_slots(*node.net_range, report.errors)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.meta["loadavg_after"] = loadavg()
    report.meta["loadavg_during"] = loads
    report.meta["wall_s"] = round(ms_since(started) / 1000, 1)
    report.meta["server_log_lines"] = {k: v for k, v in SERVER_LOG_LINES.items() if k in BACKENDS}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    if any(row.latency is not None and row.plot for row in report.rows):
        svg_path.parent.mkdir(parents=True, exist_ok=True)
        svg_path.write_text(plot(report))
    print(header(report) + "\n\n" + markdown(report))
    log(f"\nresults: {out}, plot: {svg_path}; {report.meta['wall_s']:.0f} s")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
