"""``python -m bench.interpreter`` (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("AENV_TEST_SLOT_BASE", "52000")

from tests.server.harness import API_KEY, serving
from tests.server.templates_ready import wait_ready

from aenv.client.sync import Client
from aenv.templates.code_interpreter import NAME
from bench.cli_args import apply_quick, warn_if_loaded
from bench.envd_bench.common import Latency
from bench.header import measured_on
from bench.interpreter import measure
from bench.interpreter.common import BUILD_WITHIN_S, RESULTS, log

#: (row, measured, its plain equivalent)
PAIRS = (
    ("first run_code after create (from create's return)", "first_run_code", "first_command"),
    ("create", "create_interpreter", "create_plain"),
    ("cell round trip (warm)", "run_code", "command_true"),
    ("fork x16 (prepared interpreter vs plain)", "fork_interpreter", "fork_plain"),
)


def table(rows: dict[str, Latency]) -> str:
    lines = ["| measurement | interpreter p50 / p95 ms | plain p50 / p95 ms | p50 ratio |",
             "|---|---:|---:|---:|"]
    for title, mine, plain in PAIRS:
        a, b = rows[mine], rows[plain]
        lines.append(f"| {title} (n={a.n}) | {a.p50_ms} / {a.p95_ms} | {b.p50_ms} / "
                     f"{b.p95_ms} | {round(a.p50_ms / b.p50_ms, 2)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30, help="creates and round trips")
    parser.add_argument("--forks", type=int, default=5, help="forks x16 of each")
    parser.add_argument("--quick", action="store_true", help="small numbers (CI)")
    args = parser.parse_args()
    apply_quick(args, parser, {"runs": 5, "forks": 1})
    load = warn_if_loaded(log)
    started = time.time()
    with serving(code_interpreter="true", max_sandboxes="64") as node:
        wait_ready(node, NAME, BUILD_WITHIN_S)
        log(f"{NAME} ready after {time.time() - started:.0f} s")
        samples = measure.first_run(args.runs)
        samples |= measure.round_trips(args.runs * 3)
        with Client(node.url, API_KEY) as client:
            samples |= measure.fork16(client, args.forks)
    rows = {name: Latency.of(name, values) for name, values in samples.items()}
    result = {"meta": measured_on(), "load_before": load,
              "rows": {name: vars(row) for name, row in rows.items()}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
