"""``python -m bench.envd_bench``: start envd, run the parts, write the results."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tests.conftest import free_port
from tests.envd.harness import DEFAULT_BUNDLE, start_envd

import bench.envd_bench
from bench.cli_args import LOAD_WARN
from bench.envd_bench.common import RESULTS, Report
from bench.envd_bench.latency import measure_latency
from bench.envd_bench.memory import exec_helper_of, find_envd_pid, read_memory
from bench.envd_bench.report import evaluate_targets, markdown
from bench.envd_bench.throughput import measure_throughput
from bench.header import loadavg, machine, sdk_version, utc_now


def main(argv: list[str] | None = None) -> int:
    """Run the parts, write the JSON, print the markdown; 1 if something broke."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.envd_bench",
        description=(bench.envd_bench.__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--runs", type=int, default=200, help="timed round trips per latency row")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--file-mib", type=int, default=100)
    parser.add_argument("--file-runs", type=int, default=5)
    parser.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds to let envd settle before each memory reading",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--bundle", type=Path, help=f"envd bundle (default: {DEFAULT_BUNDLE})")
    which.add_argument("--source", action="store_true", help="run envd from the source tree")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    bundle = args.bundle
    if bundle is None and not args.source and (DEFAULT_BUNDLE / "bin" / "envd").exists():
        bundle = DEFAULT_BUNDLE
    kind = "bundle" if bundle else "source tree"
    where = str(bundle) if bundle else "python -m aenv.envd (.venv)"
    print(f"envd under test: {kind} ({where})", file=sys.stderr)
    if bundle is None and not args.source:
        print(f"  ({DEFAULT_BUNDLE} not built: falling back to the source tree)", file=sys.stderr)

    from e2b import Sandbox  # after argparse: --help should not pay for the SDK import

    load_before = os.getloadavg()
    if load_before[0] > LOAD_WARN:
        print(
            f"warning: 1-minute load average is {load_before[0]:.2f} on {os.cpu_count()} CPUs; "
            "something else is running and the numbers will be noisy",
            file=sys.stderr,
        )
    started = time.perf_counter()
    envd = start_envd(free_port(), bundle=bundle)
    # bwrap setup + interpreter start + imports + first /health answer (polled every 50 ms).
    start_ms = round((time.perf_counter() - started) * 1000)
    report = Report(
        meta={
            "date": utc_now(),
            "envd": {"kind": kind, "path": where},
            "machine": machine(),
            "python": platform.python_version(),
            "sdk": sdk_version(),
            "runs": args.runs,
            "warmup": args.warmup,
            "file_mib": args.file_mib,
            "file_runs": args.file_runs,
            "envd_start_to_healthy_ms": start_ms,
            "loadavg_before": loadavg(load_before),
        }
    )
    try:
        pid = find_envd_pid(envd.process.pid)
        report.meta["envd"]["exec_helper"] = exec_helper_of(pid, bundle)
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after start"))
        # The SDK reads these when a Sandbox is created; debug mode = no control plane.
        os.environ["E2B_DEBUG"] = "true"
        os.environ["E2B_SANDBOX_URL"] = envd.url
        sandbox = Sandbox.create()
        print("measuring latency ...", file=sys.stderr)
        measure_latency(report, sandbox, envd.url, args.runs, args.warmup)
        # Separates growth from ~1500 RPCs (leaks, caches) from growth due to 100 MiB buffers.
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after the latency runs"))
        print("measuring throughput ...", file=sys.stderr)
        measure_throughput(report, sandbox, envd, args.file_mib, args.file_runs)
        time.sleep(args.settle)
        report.memory.append(read_memory(pid, "idle, after the file transfers"))
    finally:
        envd.stop()
        if "Traceback" in envd.log():
            report.errors.append("envd log has tracebacks:\n" + envd.log()[-2000:])
    report.meta["loadavg_after"] = loadavg()
    evaluate_targets(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(report), indent=2) + "\n")
    print(markdown(report))
    print(f"\nresults: {args.out}", file=sys.stderr)
    # Missed targets are findings, not failures; broken transfers or envd errors are failures.
    unverified = [t.name for t in report.throughput if not t.error and not t.verified]
    return 1 if report.errors or unverified else 0


if __name__ == "__main__":
    sys.exit(main())
