"""OCI image benchmark ("any environment"): cold start of an uncached and a cached image,
template build times, create from a built template next to ``base``, disk of many sandboxes.

Starts a local ``docker-registry`` with the ready-made test images (``busybox``, ``debian``:
the base template's tree as one 131 MB gzip layer) and one node server (no warm pool, a private
layer store; see ``bench/images/common.py``), drives it with ``POST /sandboxes-cold`` and the
official e2b SDK (``Sandbox``, ``Template``), and puts every number next to its bare
equivalent measured in the same run:

1. ``cold``: uncached / cached cold start → first command; bare ``skopeo copy`` + ``tar`` and
   bare ``runsc run`` + ``exec`` over the same layer (``bench/images/cold.py``).
2. ``build``: a three-step template forced / last step changed / unchanged; bare cold boot +
   checkpoint (``bench/images/build.py``).
3. ``create``: create from the built template vs from ``base`` (``bench/images/create.py``).
4. ``disk``: du of the layers, uppers and runtime state of 50 sandboxes of one image
   (``bench/images/disk.py``).

Writes bench/results/images.json, docs/img/images.svg (p50 bars, p95 whiskers, bare p50 as
a grey diamond) and prints a markdown report (copied into docs/benchmarks.md). Missed targets
are findings: the exit status is non-zero only when something failed or the node logged a
traceback.
"""

from __future__ import annotations

import os

# Before anything imports lifecycle_bench (which defaults the slot base to its own range).
os.environ.setdefault("AENV_TEST_SLOT_BASE", "44000")

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

from tests.images import push, ready_image
from tests.registry import run_registry
from tests.server.harness import kill_leaked

from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, environment, load_line, loadavg, measured_on
from bench.images.build import measure_build
from bench.images.cold import measure_cold
from bench.images.common import (
    Bench,
    TestImage,
    private_layer_store,
    start_node,
)
from bench.images.create import measure_create
from bench.images.disk import measure_disk
from bench.lifecycle_bench import KEEP_LOG_RE, Report, guarded, log, markdown, svg
from bench.node_bench.common import ms_since
from bench.node_bench.node import SERVER_LOG_LINES, stop_node, sweep_slots

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "images.json"
SVG = REPO / "docs" / "img" / "images.svg"
PARTS = ("cold", "build", "create", "disk")


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def header(report: Report) -> str:
    meta = report.meta
    return (
        f"{environment(meta)} on the same machine. Node: no warm pool, private layer store. "
        f"{load_line(meta)}. Wall time {meta['wall_s']:.0f} s."
    )


def plot(report: Report) -> str:
    """lifecycle_bench's plot, titled for this benchmark."""
    return (
        svg(report)
        .replace(">aenv lifecycle operations:", ">aenv images: cold start, build, create:")
        .replace(
            "Children of a fork are restored concurrently on 2 shared vCPUs.",
            "Bare: skopeo/tar/runsc doing the same work in the same run.",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busybox-runs", type=int, default=7)
    parser.add_argument("--debian-runs", type=int, default=5)
    parser.add_argument("--build-rounds", type=int, default=3)
    parser.add_argument("--create-runs", type=int, default=15)
    parser.add_argument("--disk-sandboxes", type=int, default=50)
    parser.add_argument("--disk-batch", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="few runs (development)")
    parser.add_argument("--only", default=",".join(PARTS), help="subset of: " + ", ".join(PARTS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--svg", type=Path, default=None)
    args = parser.parse_args(argv)
    apply_quick(
        args,
        parser,
        {
            "busybox_runs": 2,
            "debian_runs": 1,
            "build_rounds": 1,
            "create_runs": 3,
            "disk_sandboxes": 6,
            "disk_batch": 3,
        },
    )
    out = args.out or (RESULTS.with_name("images-quick.json") if args.quick else RESULTS)
    svg_path = args.svg or (out.with_suffix(".svg") if args.quick else SVG)
    only = set(args.only.split(","))

    signal.signal(signal.SIGTERM, _sigterm)
    load_before = warn_if_loaded(log)
    report = Report(
        meta={
            **measured_on(),
            "args": arg_strings(args),
            "loadavg_before": loadavg(load_before),
            "warm_pool_size": 0,
            "slot_base": os.environ["AENV_TEST_SLOT_BASE"],
        }
    )
    loads: dict[str, float] = {}
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="ib-", dir="/tmp"))
    layers_dir: Path | None = None
    node = None
    try:
        with run_registry() as registry:
            images = {}
            for name in ("busybox", "debian"):
                built = ready_image(name)
                images[name] = TestImage(name, push(built, registry, name).ref, built)
            layers_dir = private_layer_store()
            node = start_node(layers_dir)
            bench = Bench(report, node, registry, images, scratch)
            parts: list[tuple[str, Callable[[], None]]] = [
                (
                    "cold",
                    lambda: measure_cold(
                        bench, {"busybox": args.busybox_runs, "debian": args.debian_runs}, 1
                    ),
                ),
                ("build", lambda: measure_build(bench, args.build_rounds)),
                ("create", lambda: measure_create(bench, args.create_runs)),
                ("disk", lambda: measure_disk(bench, args.disk_sandboxes, args.disk_batch)),
            ]
            for name, part in parts:
                if name not in only:
                    continue
                loads[name] = os.getloadavg()[0]
                log(f"[{ms_since(started) / 1000:.0f} s] measuring {name} (load {loads[name]:.1f})")
                with guarded(report, name):
                    part()
            log(f"[{ms_since(started) / 1000:.0f} s] cleaning up")
    finally:
        if node is not None:
            kept = [
                line
                for line in node.server.log().splitlines()
                if KEEP_LOG_RE.search(line)
                or "pulled " in line
                or "unpacked layer" in line
                or "build " in line
            ]
            stop_node(node, report.errors)
            leaked = kill_leaked(node.server.home)
            if leaked:
                report.errors.append(f"killed {len(leaked)} leaked runsc processes")
            SERVER_LOG_LINES["images"] = kept[-3000:]
            sweep_slots(*node.net_range, report.errors)
        if layers_dir is not None:
            shutil.rmtree(layers_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    report.meta["loadavg_after"] = loadavg()
    report.meta["loadavg_during"] = loads
    report.meta["wall_s"] = round(ms_since(started) / 1000, 1)
    report.meta["server_log_lines"] = SERVER_LOG_LINES.get("images", [])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(report), indent=2, default=str) + "\n")
    if any(row.latency is not None and row.plot for row in report.rows):  # disk alone: no bars
        svg_path.parent.mkdir(parents=True, exist_ok=True)
        svg_path.write_text(plot(report))
    table = markdown(report).split("\n\n", 1)
    print(header(report) + ("\n\n" + table[1] if len(table) > 1 else ""))
    log(f"\nresults: {out}, plot: {svg_path}; {report.meta['wall_s']:.0f} s")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
