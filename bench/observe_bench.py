"""What metrics and logs cost the lifecycle (issue 25, docs/benchmarks.md, "Observability").

Two real nodes on this machine, one with everything recorded (sandbox logs, webhooks with a
webhook registered, team metrics, the gauges: ``observe = true``) and one without
(``observe = false``); rounds alternate between them so the machine's noise falls on both
alike. A round, through the official SDK: create → first command → pause → resume (connect)
→ kill, each timed. Reported per operation: p50 and p95 on each node and the ratio of the
p50s (the target: ≤ 1.02), and the same for the whole cycle; sustained (rounds back to back).

Writes bench/results/observe.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40800")

import httpx
from e2b import Sandbox
from tests.conftest import free_port
from tests.server.harness import API_KEY, NodeServer, cleanup_home, kill_leaked, start_server

from bench.cli_args import apply_quick, warn_if_loaded

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "observe.json"
PHASES = ("create", "first_command", "pause", "resume", "kill", "cycle")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: A webhook receiver that answers 204 to everything, run as its own process: in this one its
#: thread would take the GIL from the SDK calls being timed.
_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *_):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@contextlib.contextmanager
def _receiver() -> Iterator[str]:
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(port)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        child.kill()
        child.wait()


@contextlib.contextmanager
def _node(observe: bool) -> Iterator[NodeServer]:
    server = start_server(free_port(), observe=str(observe).lower(),
                          webhook_allow_private="true")
    try:
        yield server
    finally:
        server.stop()
        kill_leaked(server.home)
        cleanup_home(server.home)


def _cycle(node: NodeServer) -> dict[str, float]:
    opts: dict[str, Any] = {"api_key": API_KEY, "api_url": node.url, "sandbox_url": node.url,
                            "domain": "aenv.test"}
    took: dict[str, float] = {}
    began = time.perf_counter()
    start = time.perf_counter()
    sbx = Sandbox.create(timeout=120, **opts)
    took["create"] = (time.perf_counter() - start) * 1e3
    try:
        start = time.perf_counter()
        sbx.commands.run("true")
        took["first_command"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        sbx.pause()
        took["pause"] = (time.perf_counter() - start) * 1e3
        start = time.perf_counter()
        Sandbox.connect(sbx.sandbox_id, **opts)
        took["resume"] = (time.perf_counter() - start) * 1e3
    finally:
        start = time.perf_counter()
        Sandbox.kill(sbx.sandbox_id, **opts)
        took["kill"] = (time.perf_counter() - start) * 1e3
    took["cycle"] = (time.perf_counter() - began) * 1e3
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    apply_quick(args, parser, {"rounds": 8})
    load = warn_if_loaded(lambda m: print(m, file=sys.stderr))
    times: dict[str, dict[str, list[float]]] = {"on": {p: [] for p in PHASES},
                                                 "off": {p: [] for p in PHASES}}
    with _receiver() as hook_url, _node(True) as on, _node(False) as off:
        httpx.post(f"{on.url}/events/webhooks", headers={"X-API-KEY": API_KEY},
                   json={"name": "bench", "url": hook_url, "signatureSecret": "bench"},
                   timeout=30).raise_for_status()
        nodes = {"on": on, "off": off}
        for name in ("on", "off"):  # a warm-up cycle each
            _cycle(nodes[name])
        for i in range(args.rounds):
            for name in (("on", "off") if i % 2 == 0 else ("off", "on")):
                for phase, ms in _cycle(nodes[name]).items():
                    times[name][phase].append(ms)
        delivered = httpx.get(f"{on.url}/events/webhooks", headers={"X-API-KEY": API_KEY},
                              timeout=30).json()
    rows = {phase: {name: {"p50_ms": _pct(times[name][phase], 0.5),
                           "p95_ms": _pct(times[name][phase], 0.95)} for name in times}
            for phase in PHASES}
    for row in rows.values():
        row["ratio_p50"] = round(row["on"]["p50_ms"] / row["off"]["p50_ms"], 3)
    result = {"load": load, "rounds": args.rounds, "phases": rows,
              "webhooks": len(delivered)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("| phase | on p50 | on p95 | off p50 | off p95 | on / off (p50) |")
    print("|---|---|---|---|---|---|")
    for phase, row in rows.items():
        print(f"| {phase} | {row['on']['p50_ms']:.1f} ms | {row['on']['p95_ms']:.1f} ms | "
              f"{row['off']['p50_ms']:.1f} ms | {row['off']['p95_ms']:.1f} ms | "
              f"{row['ratio_p50']:.3f} |")


if __name__ == "__main__":
    main()
