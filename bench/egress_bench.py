"""Egress through the node's proxy (domain rules) against straight out (address rules only):
what a name-checked connection costs (issue 24, docs/security.md).

Two slots of the node's pool (network/pool.py), each a namespace with Linux's own stack as
the guest (the node's side is what is measured, not gVisor's): one whose policy names a
domain — its HTTP goes through the proxy, which reads the Host header, resolves the name with
a DNS server standing in for the internet's, and splices — and one with an address rule
only, which nft forwards. Both reach the same HTTP server in the internet peer's namespace
(tests/network/egress_world.py). In the guest, interleaved rounds of:

- **new connections**: one request per connection, sequential: p50/p99 latency and
  requests/s (the proxy's whole cost: accept, head, resolve, connect);
- **bulk**: one connection reading a large body: MB/s (the splice).

Each over plain HTTP (through the proxy / straight out) and over HTTPS, checked by the guest:
straight out, through the proxy by SNI (the TLS passes through), and to a host with header
rules (the node ends the guest's TLS with its CA and opens its own to the host).

Writes bench/results/egress.json and prints a markdown table (docs/benchmarks.md, "Egress").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40700")

from tests.network.egress_world import World, egress_world
from tests.network.fixtures import pool_config
from tests.network.peers import InternetPeer

from aenv.core.net import NetSlot
from aenv.network.egress_tls import Interception
from aenv.network.pool import SlotPool
from aenv.orchestrator.egress import policy_from
from bench.cli_args import apply_quick, warn_if_loaded

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "egress.json"

#: In the guest: ``count`` requests, each on a new connection, then one bulk read; JSON out.
CLIENT = r"""
import json, socket, ssl, sys, time
ip, host, count, bulk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cafile = sys.argv[5]  # "": plain HTTP; else HTTPS, checked against this CA
context = ssl.create_default_context(cafile=cafile) if cafile else None
def get(path):
    sock = socket.create_connection((ip, 443 if context else 80), timeout=10)
    if context:
        sock = context.wrap_socket(sock, server_hostname=host)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    total = 0
    while chunk := sock.recv(1 << 16):
        total += len(chunk)
    sock.close()
    return total
times = []
for _ in range(count):
    start = time.perf_counter(); get("/"); times.append(time.perf_counter() - start)
start = time.perf_counter(); size = get(f"/bulk?{bulk}"); took = time.perf_counter() - start
print(json.dumps({"times": times, "bulk_bytes": size, "bulk_s": took}))
"""

async def _run(slot: NetSlot, ip: str, host: str, count: int, bulk: int,
               cafile: str = "") -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        "nsenter", f"--net=/run/netns/{slot.netns}", "--", sys.executable, "-c", CLIENT, ip,
        host, str(count), str(bulk), cafile, stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(child.communicate(), 600)
    result: dict[str, Any] = json.loads(out)
    return result


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _bench(world: World, rounds: int, count: int, bulk: int,
                 scratch: Path) -> dict[str, Any]:
    pool = SlotPool(pool_config(first_index=61_900, last_index=61_999,
                                resolvers=(world.dns_ip,)))
    pool.proxy.interception = Interception(b"bench", scratch / "tls",
                                           upstream_cafile=world.ca_file)
    pool.proxy.interception.prepare()
    platform_ca = scratch / "platform-ca.pem"
    platform_ca.write_text(pool.proxy.interception.ca_pem)
    world_ca = str(world.ca_file)
    await pool.start()
    try:
        proxied = await pool.acquire(policy_from(None, {"allowOut": ["allowed.test"],
                                                        "denyOut": ["0.0.0.0/0"]}))
        direct = await pool.acquire(policy_from(None, {"allowOut": [world.a_ip],
                                                       "denyOut": ["0.0.0.0/0"]}))
        ruled = await pool.acquire(policy_from(None, {
            "allowOut": ["allowed.test"], "denyOut": ["0.0.0.0/0"],
            "rules": {"allowed.test": [{"transform": {"headers": {"X-Api-Key": "bench"}}}]}}))
        # name → (slot, CA the guest checks with; "" plain HTTP)
        modes = {"proxy": (proxied, ""), "direct": (direct, ""),
                 "https direct": (direct, world_ca), "https by SNI": (proxied, world_ca),
                 "https with rules": (ruled, str(platform_ca))}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
        for _ in range(rounds):
            for name, (slot, cafile) in modes.items():
                runs[name].append(await _run(slot, world.a_ip, "allowed.test", count, bulk,
                                             cafile))
        for slot in (proxied, direct, ruled):
            await pool.release(slot)
    finally:
        await pool.close()
    out: dict[str, Any] = {}
    for name, results in runs.items():
        times = [t * 1e3 for r in results for t in r["times"]]
        mbps = [r["bulk_bytes"] / r["bulk_s"] / 1e6 for r in results]
        out[name] = {"p50_ms": _pct(times, 0.5), "p99_ms": _pct(times, 0.99),
                     "requests_per_s": len(times) / (sum(times) / 1e3), "n": len(times),
                     "bulk_mb_per_s": statistics.median(mbps)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--bulk-mb", type=int, default=256)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    apply_quick(args, parser, {"rounds": 2, "requests": 50, "bulk_mb": 32})
    load = warn_if_loaded(lambda m: print(m, file=sys.stderr))
    peer = InternetPeer()
    peer.start()
    try:
        with egress_world(peer) as world, tempfile.TemporaryDirectory() as scratch:
            result = asyncio.run(_bench(world, args.rounds, args.requests,
                                        args.bulk_mb << 20, Path(scratch)))
    finally:
        peer.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"load": load, **result}, indent=2) + "\n")
    print("| mode | new connection p50 | p99 | requests/s | one connection, bulk |\n"
          "|---|---|---|---|---|")
    for name, row in result.items():
        print(f"| {name} | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms | "
              f"{row['requests_per_s']:.0f} | {row['bulk_mb_per_s']:.0f} MB/s |")
    print(f"\nthe proxy's cost per connection (p50): "
          f"{result['proxy']['p50_ms'] - result['direct']['p50_ms']:.2f} ms (HTTP), "
          f"{result['https by SNI']['p50_ms'] - result['https direct']['p50_ms']:.2f} ms "
          f"(HTTPS by SNI), "
          f"{result['https with rules']['p50_ms'] - result['https direct']['p50_ms']:.2f} ms "
          f"(HTTPS ended by the node)")


if __name__ == "__main__":
    main()
