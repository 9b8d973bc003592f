"""Proxy benchmark: HTTP requests/s and latency through the node's proxy vs straight to the
sandbox, and a WebSocket echo round trip (issue 11).

Starts one real node server (``tests/server/harness.py``), creates one sandbox with the e2b
SDK, starts two servers inside it (``python3 -m http.server`` on 8000 and a dependency-free
WebSocket echo server on 8765; envd's own ``/health`` on 49983 is the third target), then runs
interleaved rounds of ``wrk -t2 -c16 --latency`` against:

- **proxy**: the node (127.0.0.1:<port>) with ``Host: {port}-{id}.aenv.test``, as a browser or
  ``get_host()`` user reaches a sandbox port;
- **straight**: the guest address 169.254.0.21:<port> itself, from the host, over the same
  path the proxy's upstream hop takes (a TCP socket bound to the slot's host veth with
  ``SO_BINDTODEVICE``). wrk cannot bind a device, so it runs with a tiny ``LD_PRELOAD`` shim
  (compiled here with gcc) whose ``connect()`` binds every IPv4 socket to ``$AENV_BIND_DEV``
  first. Straight = no proxy process at all, same veth, same guest netstack;
- **node**: the node's own ``GET /health`` (no sandbox), the server's floor.

Server CPU per request = the node process's utime+stime delta (``/proc/<pid>/stat``) over the
round, divided by wrk's request count. WebSocket: ``--ws-messages`` text echoes of 32 bytes,
one at a time, with the ``websockets`` client, through the proxy (E2b-Sandbox-Id/Port headers)
and straight (bound socket), alternating in blocks of 50.

Writes bench/results/proxy.json and prints a markdown table (docs/benchmarks.md, "Proxy").
``--profile PATH``: py-spy (if installed) records the server during the first proxied round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AENV_TEST_SLOT_BASE", "40500")

from e2b import Sandbox
from tests.server.harness import NodeServer, serving
from websockets.asyncio.client import connect as ws_connect

from bench.cli_args import apply_quick, warn_if_loaded

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "proxy.json"
GUEST_IP = "169.254.0.21"
ENVD_PORT = 49983
HTTP_PORT = 8000
WS_PORT = 8765
DOMAIN = "aenv.test"

_SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = dlsym(RTLD_NEXT, "connect");
    const char *dev = getenv("AENV_BIND_DEV");
    if (dev && addr && addr->sa_family == AF_INET)
        setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, strlen(dev));
    return real(fd, addr, len);
}
"""

# A WebSocket echo server with the standard library only (RFC 6455: handshake, masked client
# frames, unfragmented text/binary, ping, close): the base template has python3, no packages.
_WS_ECHO = r"""
import asyncio, base64, hashlib, struct
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
async def handle(r, w):
    head = await r.readuntil(b"\r\n\r\n")
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + GUID).digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        b0, b1 = await r.readexactly(2)
        n = b1 & 127
        if n == 126: n = struct.unpack("!H", await r.readexactly(2))[0]
        elif n == 127: n = struct.unpack("!Q", await r.readexactly(8))[0]
        mask = await r.readexactly(4) if b1 & 128 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(n)))
        op = b0 & 15
        if op == 8:
            w.write(b"\x88\x02" + data[:2]); await w.drain(); w.close(); return
        if op == 9: op = 10
        hdr = bytes([128 | op]) + (bytes([n]) if n < 126 else struct.pack("!BH", 126, n)
                                   if n < 65536 else struct.pack("!BQ", 127, n))
        w.write(hdr + data); await w.drain()
async def main():
    await (await asyncio.start_server(handle, "0.0.0.0", PORT)).serve_forever()
asyncio.run(main())
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_shim(workdir: Path) -> Path:
    src, lib = workdir / "bind_dev.c", workdir / "bind_dev.so"
    src.write_text(_SHIM_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src), "-ldl"],
                   check=True)
    return lib


def host_ifname(server: NodeServer, sandbox_id: str) -> str:
    """The host veth of the sandbox's network slot, from the node's store (read-only)."""
    db = server.home / "state.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute("SELECT instance FROM sandboxes WHERE sandbox_id = ?",
                           (sandbox_id,)).fetchone()
    return str(json.loads(row[0])["slot"]["host_ifname"])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(out: str) -> dict[str, float]:
    pct = {m.group(1): _ms(m.group(2))
           for m in re.finditer(r"^\s+(50|99)(?:\.0+)?%\s+(\S+)\s*$", out, re.M)}
    requests = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    assert requests and rps and "99" in pct, out
    return {"requests": int(requests.group(1)), "rps": float(rps.group(1)),
            "p50_ms": pct["50"], "p99_ms": pct["99"],
            "bad": int(errors.group(1)) if errors else 0,
            "socket_errors": socket_errors.group(1) if socket_errors else ""}  # type: ignore[dict-item]


def run_wrk(url: str, *, duration: int, connections: int, host: str | None = None,
            env: dict[str, str] | None = None, server_pid: int,
            profile: Path | None = None) -> dict[str, Any]:
    argv = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{duration}s",
            "--latency", url]
    if host:
        argv[1:1] = ["-H", f"Host: {host}"]
    spy = None
    py_spy = shutil.which("py-spy", path=f"{REPO}/.venv/bin:{os.environ['PATH']}")
    if profile is not None and py_spy:
        spy = subprocess.Popen([py_spy, "record", "-p", str(server_pid), "-d", str(duration),
                                "-r", "200", "-f", "raw", "-o", str(profile), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = cpu_seconds(server_pid)
    done = subprocess.run(argv, capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})})
    used = cpu_seconds(server_pid) - before
    if spy is not None:
        spy.wait()
    result: dict[str, Any] = parse_wrk(done.stdout)
    result["server_cpu_ms_per_req"] = round(1000 * used / max(1, result["requests"]), 3)
    return result


def bound_socket(ifname: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.connect((GUEST_IP, port))
    sock.setblocking(False)
    return sock


async def ws_round_trips(url: str, count: int, *, headers: dict[str, str] | None = None,
                         sock: socket.socket | None = None) -> list[float]:
    times = []
    async with ws_connect(url, additional_headers=headers, sock=sock, compression=None) as ws:
        for i in range(count):
            message = f"{i:032d}"
            started = time.perf_counter()
            await ws.send(message)
            echoed = await ws.recv()
            times.append((time.perf_counter() - started) * 1000)
            assert echoed == message, (echoed, message)
    return times


def ws_bench(server: NodeServer, sandbox_id: str, ifname: str, messages: int) -> dict[str, Any]:
    proxied: list[float] = []
    straight: list[float] = []
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(WS_PORT)}
    block = 50
    for start in range(0, messages, block):
        n = min(block, messages - start)
        proxied += asyncio.run(ws_round_trips(f"ws://127.0.0.1:{server.port}/", n,
                                              headers=headers))
        straight += asyncio.run(ws_round_trips(f"ws://{GUEST_IP}:{WS_PORT}/", n,
                                               sock=bound_socket(ifname, WS_PORT)))

    def summary(xs: list[float]) -> dict[str, float]:
        q = statistics.quantiles(xs, n=100)
        return {"n": len(xs), "p50_ms": round(statistics.median(xs), 3),
                "p95_ms": round(q[94], 3)}
    return {"proxy": summary(proxied), "straight": summary(straight)}


def start_guest_servers(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/ws_echo.py", _WS_ECHO.replace("PORT", str(WS_PORT)))
    sandbox.commands.run(f"python3 -m http.server {HTTP_PORT} --bind 0.0.0.0 -d /tmp "
                         ">/dev/null 2>&1", background=True, timeout=0)
    sandbox.commands.run("python3 /tmp/ws_echo.py >/tmp/ws.log 2>&1", background=True,
                         timeout=0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        check = sandbox.commands.run(
            f"python3 -c \"import socket; [socket.create_connection(('127.0.0.1', p), 1) "
            f"for p in ({HTTP_PORT}, {WS_PORT})]\" 2>/dev/null; echo $?", timeout=10)
        if check.stdout.strip() == "0":
            return
        time.sleep(0.2)
    raise RuntimeError("the guest servers did not start")


def markdown(report: dict[str, Any]) -> str:
    rows = ["| target | path | rounds | req/s (median) | p50 ms | p99 ms | server CPU ms/req "
            "| proxy/straight req/s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    med = report["median"]
    for name, by_path in med.items():
        for path, m in by_path.items():
            ratio = ""
            if path == "proxy" and "straight" in by_path:
                ratio = f"{m['rps'] / by_path['straight']['rps']:.2f}"
            rows.append(f"| {name} | {path} | {m['rounds']} | {m['rps']:.0f} | {m['p50_ms']:.2f} "
                        f"| {m['p99_ms']:.2f} | {m['server_cpu_ms_per_req']:.3f} | {ratio} |")
    ws = report["websocket"]
    rows += ["", "| WebSocket echo (32 B) | messages | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
    for path in ("proxy", "straight"):
        rows.append(f"| {path} | {ws[path]['n']} | {ws[path]['p50_ms']:.3f} "
                    f"| {ws[path]['p95_ms']:.3f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved wrk rounds")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--ws-messages", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s, 200 messages")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args(argv)
    apply_quick(args, parser, {"rounds": 1, "duration": 3, "ws_messages": 200})
    if not shutil.which("wrk"):
        log("wrk is missing: run scripts/install-system-deps.sh")
        return 2
    load_before = warn_if_loaded(log)
    started = time.time()
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, serving() as server:
        shim = build_shim(Path(tmp))
        sandbox = Sandbox.create(timeout=3600)
        ifname = host_ifname(server, sandbox.sandbox_id)
        start_guest_servers(sandbox)
        pid = server.process.pid
        node = f"http://127.0.0.1:{server.port}"
        straight_env = {"LD_PRELOAD": str(shim), "AENV_BIND_DEV": ifname}
        plan: list[tuple[str, str, str, str | None, dict[str, str] | None]] = [
            ("node GET /health", "node", f"{node}/health", None, None)]
        for name, port, path in (("envd GET /health", ENVD_PORT, "/health"),
                                 ("http.server GET / (dir listing)", HTTP_PORT, "/")):
            plan.append((name, "proxy", f"{node}{path}", f"{port}-{sandbox.sandbox_id}.{DOMAIN}",
                         None))
            plan.append((name, "straight", f"http://{GUEST_IP}:{port}{path}", None,
                         straight_env))
        for _, _, url, host, env in plan:  # warm-up: connections, caches
            run_wrk(url, duration=1, connections=args.connections, host=host, env=env,
                    server_pid=pid)
        for round_no in range(args.rounds):
            for name, path, url, host, env in plan:
                profile = args.profile if (round_no == 0 and path == "proxy"
                                           and name.startswith("envd")) else None
                result = run_wrk(url, duration=args.duration, connections=args.connections,
                                 host=host, env=env, server_pid=pid, profile=profile)
                samples.setdefault(name, {}).setdefault(path, []).append(result)
                log(f"round {round_no + 1} {name} {path}: {result['rps']:.0f} req/s, "
                    f"p99 {result['p99_ms']:.2f} ms, cpu {result['server_cpu_ms_per_req']} ms/req"
                    + (f", non-2xx {result['bad']}" if result["bad"] else ""))
        websocket = ws_bench(server, sandbox.sandbox_id, ifname, args.ws_messages)
        sandbox.kill()
    median: dict[str, dict[str, dict[str, float]]] = {}
    for name, by_path in samples.items():
        for path, runs in by_path.items():
            median.setdefault(name, {})[path] = {
                "rounds": len(runs),
                **{k: round(statistics.median(r[k] for r in runs), 3)
                   for k in ("rps", "p50_ms", "p99_ms", "server_cpu_ms_per_req")}}
    report = {"meta": {"started": started, "wall_s": round(time.time() - started, 1),
                       "load_before": load_before, "load_after": os.getloadavg(),
                       "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()}},
              "median": median, "samples": samples, "websocket": websocket}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
