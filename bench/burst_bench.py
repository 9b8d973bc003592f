"""Burst benchmark: 100 concurrent creates against one node on its default limits, and how
the node's own API answers meanwhile (issue 11, "Bursts").

Starts one real node server (``tests/server/harness.py``, the product's admission defaults,
no warm pool so every create is a restore), then for each round:

- **idle**: ``GET /health`` of the node in a loop for ``--idle`` seconds (the floor);
- **burst**: ``--burst`` creates (``POST /v2/sandboxes``) sent at once over as many
  connections, while the same ``GET /health`` loop runs; each create is answered 201, or 429
  with ``Retry-After`` (anything else is counted as an error); then every created sandbox is
  killed and the next round waits for the node to be idle again.

The health loop runs in a process of its own (``bench/burst_poll.py``: one request every
20 ms on a kept-alive connection), so neither the burst's client nor the GIL of this process
adds to what it measures. Writes bench/results/burst.json and prints a markdown table
(docs/benchmarks.md, "Bursts").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "48000")

import httpx
from tests.server.harness import API_KEY, NodeServer, kill_all_sandboxes, serving

from bench.cli_args import apply_quick, warn_if_loaded
from bench.header import arg_strings, loadavg, utc_now

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "burst.json"
POLLER = Path(__file__).with_name("burst_poll.py")
TARGET_HEALTH_MS = 100.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(samples_ms: list[float]) -> dict[str, float]:
    latencies_ms = [x for x in samples_ms if x >= 0]
    return {
        "n": len(samples_ms),
        "failed": len(samples_ms) - len(latencies_ms),
        "p50": round(statistics.median(latencies_ms), 2) if latencies_ms else 0.0,
        "p95": round(pct(latencies_ms, 0.95), 2),
        "p99": round(pct(latencies_ms, 0.99), 2),
        "max": round(max(latencies_ms, default=0.0), 2),
    }


class HealthPoll:
    """``bench/burst_poll.py`` polling the node's ``/health`` until stopped."""

    def __init__(self, port: int) -> None:
        self.out = Path(tempfile.mkstemp(prefix="burst-health-", suffix=".json")[1])
        self.process = subprocess.Popen([sys.executable, str(POLLER), str(port), str(self.out)])

    def stop(self) -> list[float]:
        self.process.terminate()
        self.process.wait(30)
        data = json.loads(self.out.read_text() or "[]")
        self.out.unlink(missing_ok=True)
        return [float(x) for x in data]


async def burst(node: NodeServer, count: int) -> tuple[list[httpx.Response], float]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(
        base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=300, limits=limits
    ) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(
                client.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300})
                for _ in range(count)
            )
        )
        return list(answers), (time.perf_counter() - started) * 1000


def classify(answers: list[httpx.Response]) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for answer in answers:
        if answer.status_code == 201:
            kinds["201"] += 1
        elif answer.status_code == 429 and answer.headers.get("retry-after"):
            kinds["429 + Retry-After"] += 1
        else:
            kinds[f"other {answer.status_code}"] += 1
    return dict(kinds)


def run_round(node: NodeServer, count: int, idle_s: float) -> dict[str, Any]:
    poll = HealthPoll(node.port)
    time.sleep(idle_s)
    idle = poll.stop()
    poll = HealthPoll(node.port)
    time.sleep(0.5)
    answers, total_ms = asyncio.run(burst(node, count))
    during = poll.stop()
    kinds = classify(answers)
    kill_all_sandboxes()
    time.sleep(2.0)  # the kills' reaping and the slot refills end before the next round
    return {"idle_ms": idle, "burst_ms": during, "answers": kinds, "total_ms": total_ms}


def table(rounds: list[dict[str, Any]]) -> str:
    idle = summary([x for r in rounds for x in r["idle_ms"]])
    during = summary([x for r in rounds for x in r["burst_ms"]])
    answers: Counter[str] = Counter()
    for r in rounds:
        answers.update(r["answers"])
    totals = [r["total_ms"] / 1000 for r in rounds]
    lines = [
        "| node `GET /health` | requests | failed | p50 ms | p95 ms | p99 ms | max ms | target |",
        "|---|---|---|---|---|---|---|---|",
        f"| idle | {idle['n']} | {idle['failed']} | {idle['p50']} | {idle['p95']} | "
        f"{idle['p99']} | {idle['max']} | |",
        f"| during {len(rounds)} bursts | {during['n']} | {during['failed']} | {during['p50']} | "
        f"{during['p95']} | {during['p99']} | {during['max']} | max ≤ {TARGET_HEALTH_MS:g} ms |",
        "",
        "answers: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))
        + f"; every burst answered in {min(totals):.1f}-{max(totals):.1f} s",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=100, help="creates sent at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="idle seconds measured")
    parser.add_argument("--quick", action="store_true", help="one small round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    apply_quick(args, parser, {"burst": 20, "rounds": 1, "idle": 2.0})
    load_before = warn_if_loaded(log)
    rounds = []
    with serving(warm_pool_size="0") as node:
        time.sleep(3.0)  # the slot pool and pre-created pool fill
        for i in range(args.rounds):
            rounds.append(run_round(node, args.burst, args.idle))
            log(
                f"round {i + 1}/{args.rounds}: {rounds[-1]['answers']}, health during: "
                f"{summary(rounds[-1]['burst_ms'])}"
            )
    report = {
        "meta": {
            "date": utc_now(),
            "args": arg_strings(args),
            "loadavg_before": loadavg(load_before),
            "loadavg_after": loadavg(),
        },
        "rounds": rounds,
    }
    out = args.out or (RESULTS.with_name("burst-quick.json") if args.quick else RESULTS)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
