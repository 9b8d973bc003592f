"""What telling teams apart costs an API call (issue 24, docs/teams.md).

Two measurements, interleaved in rounds so the machine's noise falls on both alike:

- **in process**: ``Tenancy.resolve`` (a SHA-256 of the key and a dictionary read), per call,
  against the bare dictionary read it replaces (the single-key compare it grew from);
- **over HTTP**: a node on the fake runtime (no sandboxes run: only the API is measured),
  ``GET /api-keys`` (authenticated: resolve + the team's keys) with a team's key vs
  ``GET /health`` (no authentication), sequential requests on one keep-alive connection,
  p50/p95/p99 each; the difference is the per-call cost of authentication plus the route.

Writes bench/results/auth.json and prints a markdown table (docs/benchmarks.md, "Auth").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40600")

import httpx
from tests.server.harness import API_KEY, serving

from aenv.orchestrator.team_directory import LocalDirectory
from aenv.orchestrator.tenancy import CredentialKind, Tenancy
from aenv.store.sqlite import Store
from aenv.store.tenancy import TenancyStore
from bench.cli_args import apply_quick, warn_if_loaded

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "auth.json"
KINDS = frozenset({CredentialKind.API_KEY, CredentialKind.OPERATOR})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _in_process(rounds: int, calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as home:
        store = await Store.open(Path(home) / "state.db")
        tenancy = Tenancy(LocalDirectory(TenancyStore(store.db)), TenancyStore(store.db))
        await tenancy.start(API_KEY)
        for n in range(100):  # a node with 100 teams
            await tenancy.create_team(f"team-{n}")
        _, key = await tenancy.create_credential(tenancy.default_team_id,
                                                 CredentialKind.API_KEY, "bench")
        bare = {key: "caller"}
        resolve_us, bare_us = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                await tenancy.resolve(key, KINDS)
            resolve_us.append((time.perf_counter() - start) / calls * 1e6)
            start = time.perf_counter()
            for _ in range(calls):
                bare.get(key)
            bare_us.append((time.perf_counter() - start) / calls * 1e6)
        await store.close()
    return {"resolve_us": statistics.median(resolve_us), "bare_us": statistics.median(bare_us)}


def _http(rounds: int, requests: int) -> dict[str, Any]:
    with serving(runtime="fake", net_pool_size="2", warm_pool_size="0") as node:
        with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=30) as op:
            team_key = op.post("/teams", json={"name": "bench"}).json()["apiKey"]
        timings: dict[str, list[float]] = {"authenticated": [], "none": []}
        with httpx.Client(base_url=node.url, headers={"X-API-KEY": team_key},
                          timeout=30) as client:
            for _ in range(rounds):
                for name, path in (("authenticated", "/api-keys"), ("none", "/health")):
                    for _ in range(requests):
                        start = time.perf_counter()
                        answer = client.get(path)
                        timings[name].append((time.perf_counter() - start) * 1e3)
                        assert answer.status_code == 200, answer.text
    return {name: {"p50_ms": _pct(v, 0.5), "p95_ms": _pct(v, 0.95), "p99_ms": _pct(v, 0.99),
                   "n": len(v)} for name, v in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    apply_quick(args, parser, {"rounds": 2, "calls": 10_000, "requests": 100})
    load = warn_if_loaded(lambda m: print(m, file=sys.stderr))
    local = asyncio.run(_in_process(args.rounds, args.calls))
    http = _http(args.rounds, args.requests)
    result = {"load": load, "in_process": local, "http": http}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("| measured | p50 | p95 | p99 |\n|---|---|---|---|")
    for name, row in http.items():
        print(f"| GET {'/api-keys (team key)' if name == 'authenticated' else '/health (none)'}"
              f" | {row['p50_ms']:.2f} ms | {row['p95_ms']:.2f} ms | {row['p99_ms']:.2f} ms |")
    print(f"\nin process: resolve {local['resolve_us']:.2f} µs per call, "
          f"bare dict read {local['bare_us']:.3f} µs")


if __name__ == "__main__":
    main()
