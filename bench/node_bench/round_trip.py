"""Part 3, round trips: the SDK through the proxy, next to raw requests through the proxy and
straight to the guest, and the bare spawn timed inside the sandbox."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable

import httpx

from aenv.core.net import GUEST_IP
from aenv.runtime.base import ENVD_PORT
from bench.envd_bench.common import END_STREAM_OK, SDK_CMD, Latency, time_interleaved
from bench.envd_bench.latency import in_sandbox_spawn_ms
from bench.envd_bench.raw import envelope, raw_health, raw_start
from bench.node_bench.common import Report
from bench.node_bench.node import Node


class GuestConnection(http.client.HTTPConnection):
    """HTTP/1.1 straight to a sandbox's envd, no proxy: the socket is bound to the slot's host
    veth before it connects (every guest has the same address; aenv.network.guest_http)."""

    def __init__(self, ifname: str) -> None:
        super().__init__(GUEST_IP, ENVD_PORT, timeout=60)
        self.ifname = ifname

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname.encode())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout)
        sock.connect((self.host, self.port))
        self.sock = sock

    def call(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> bytes:
        self.request(method, path, body=body, headers=headers)
        response = self.getresponse()
        data = response.read()
        if response.status not in (200, 204):
            raise RuntimeError(f"direct {method} {path}: {response.status} {data[-200:]!r}")
        return data


def direct_start(
    conn: GuestConnection, token: str, cmd: str, args: list[str]
) -> Callable[[], None]:
    body = envelope({"process": {"cmd": cmd, "args": args, "envs": {}}, "stdin": False})
    headers = {
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": "60000",
        "keepalive-ping-interval": "50",
        "X-Access-Token": token,
    }

    def call() -> None:
        if not conn.call("POST", "/process.Process/Start", body, headers).endswith(END_STREAM_OK):
            raise RuntimeError("direct Start did not end cleanly")

    return call


def measure_round_trip(report: Report, node: Node, runs: int, warmup: int, loop: int) -> None:
    """Round trips of one sandbox, through the proxy and straight to the guest (interleaved),
    then the bare spawn costs timed inside the sandbox."""
    sandbox = node.create()
    try:
        token = sandbox._envd_access_token
        proxy_headers = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            **({"X-Access-Token": token} if token else {}),
        }

        def sdk_run_true() -> None:
            if (code := sandbox.commands.run("true").exit_code) != 0:
                raise RuntimeError(f"commands.run('true') exited {code}")

        def node_health(client: httpx.Client) -> Callable[[], None]:
            def call() -> None:
                if (status := client.get("/health").status_code) != 200:
                    raise RuntimeError(f"node /health answered {status}")

            return call

        calls: dict[str, Callable[[], object]] = {}
        with (
            httpx.Client(base_url=node.server.url, headers=proxy_headers, timeout=60) as proxy,
            httpx.Client(base_url=node.server.url, timeout=60) as plain,
        ):
            calls['SDK commands.run("true") (proxy)'] = sdk_run_true
            calls["raw Start /bin/bash -l -c true (proxy)"] = raw_start(proxy, *SDK_CMD, root=False)
            ifname = node.slot_ifname(sandbox.sandbox_id)
            conn = GuestConnection(ifname) if ifname else None
            if conn is not None and token:
                calls["raw Start /bin/bash -l -c true (direct)"] = direct_start(
                    conn, token, SDK_CMD[0], SDK_CMD[1]
                )
            else:
                report.errors.append("no slot found for the direct-to-guest rows")
            calls["raw Start /bin/true (proxy)"] = raw_start(proxy, "/bin/true", [], root=False)
            calls["GET /health (proxy)"] = raw_health(proxy)
            if conn is not None:
                calls["GET /health (direct)"] = lambda: conn.call("GET", "/health", None, {})
            calls["GET /health of the node (no proxy)"] = node_health(plain)
            samples = time_interleaved(calls, runs, warmup)
            if conn is not None:
                conn.close()
        report.round_trip = [Latency.of(name, ms) for name, ms in samples.items()]
        bash = in_sandbox_spawn_ms(sandbox, "/bin/bash -l -c true", loop)
        true = in_sandbox_spawn_ms(sandbox, "/bin/true", loop)
    finally:
        sandbox.kill()
    med = {lat.name: lat.p50_ms for lat in report.round_trip}
    sdk = med['SDK commands.run("true") (proxy)']
    report.derived = {
        "bare_spawn_bash_login_ms": bash,
        "bare_spawn_bin_true_ms": true,
        "overhead_over_bare_bash_ms": round(sdk - bash, 3),
        "proxy_health_minus_direct_ms": round(
            med["GET /health (proxy)"] - med.get("GET /health (direct)", float("nan")), 3
        ),
        "proxy_start_minus_direct_ms": round(
            med["raw Start /bin/bash -l -c true (proxy)"]
            - med.get("raw Start /bin/bash -l -c true (direct)", float("nan")),
            3,
        ),
        "sdk_minus_httpx_ms": round(sdk - med["raw Start /bin/bash -l -c true (proxy)"], 3),
    }
