"""The cluster layout of issue 13 on one machine: nodes in network namespaces of their own,
two schedulers, two gateways, a real Redis and a real S3 server.

Each node runs in a network namespace joined to the host by a veth pair and listens on its
own address there (``10.251.<block>.<4i+2>``); it shares the host's mounts, so what it mounts
is where the tests look. Redis and the S3 server listen on a *hub* address of the host (on
its loopback interface: there is no dummy-interface module here), which every namespace
reaches over its veth. Gateways and schedulers run on
the host's loopback, as the tests do. ``<block>`` comes from the session's slot base, so test
sessions in parallel use disjoint names and addresses.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tests.cluster.services import Service, service
from tests.conftest import free_port
from tests.redis_server import RedisServer, run_redis
from tests.s3 import S3Server, run_s3_server
from tests.server.harness import (
    API_KEY,
    NodeServer,
    cleanup_home,
    kill_leaked,
    slot_base,
    start_server,
)
from tests.server.test_shared_repository import s3_settings


@dataclass(frozen=True)
class Namespace:
    """A network namespace with a veth pair to the host."""

    name: str
    host_if: str
    host_ip: str
    node_ip: str


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _gone(*args: str) -> None:
    subprocess.run(["ip", *args], check=False, capture_output=True, timeout=30)


@contextlib.contextmanager
def namespaces(count: int) -> Iterator[tuple[str, list[Namespace]]]:
    """The hub address and ``count`` namespaces; all removed at the end."""
    block = (slot_base() // 1_000) % 250
    prefix = f"10.251.{block}"
    hub_ip = f"{prefix}.254"
    made = [Namespace(f"aenvt-{block}-{i}", f"aenvt{block}h{i}", f"{prefix}.{4 * i + 1}",
                      f"{prefix}.{4 * i + 2}") for i in range(count)]

    def remove() -> None:
        for ns in made:
            _gone("link", "del", ns.host_if)
            _gone("netns", "del", ns.name)
        _gone("addr", "del", f"{hub_ip}/32", "dev", "lo")

    remove()  # what a killed session left
    try:
        _ip("addr", "add", f"{hub_ip}/32", "dev", "lo")
        for ns in made:
            _ip("netns", "add", ns.name)
            _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", "eth0",
                "netns", ns.name)
            _ip("addr", "add", f"{ns.host_ip}/30", "dev", ns.host_if)
            _ip("link", "set", ns.host_if, "up")
            _ip("link", "set", "lo", "up", netns=ns.name)
            _ip("addr", "add", f"{ns.node_ip}/30", "dev", "eth0", netns=ns.name)
            _ip("link", "set", "eth0", "up", netns=ns.name)
            _ip("route", "add", "default", "via", ns.host_ip, netns=ns.name)
        yield hub_ip, made
    finally:
        remove()


@dataclass
class Layout:
    nonce: str
    redis: RedisServer
    s3: S3Server
    nodes: list[NodeServer]
    schedulers: list[Service]
    gateways: list[Service]
    names: list[Namespace] = field(default_factory=list)

    def node_id(self, index: int) -> str:
        return f"n{index}-{self.nonce}"

    def index_of(self, node_id: str | None) -> int:
        return next(i for i in range(len(self.nodes)) if self.node_id(i) == node_id)

    def point_sdk_at(self, gateway: Service) -> dict[str, str]:
        """The SDK's environment for ``gateway`` (to set with ``os.environ.update``)."""
        return {"E2B_API_URL": gateway.url, "E2B_SANDBOX_URL": gateway.url,
                "E2B_API_KEY": API_KEY, "E2B_DOMAIN": "aenv.test"}


def stop_node(node: NodeServer) -> None:
    if node.process.poll() is None:
        node.stop()
    kill_leaked(node.home)
    cleanup_home(node.home)


@contextlib.contextmanager
def cluster_layout(nodes: int = 3, schedulers: int = 2, gateways: int = 2,
                   **node_settings: str) -> Iterator[Layout]:
    """Everything started (nodes in parallel), gateway ``i`` asking scheduler ``i % n``."""
    nonce = secrets.token_hex(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with namespaces(nodes) as (hub_ip, names), run_redis(host=hub_ip) as redis, \
         run_s3_server(host=hub_ip) as s3, contextlib.ExitStack() as stack:
        settings = {**s3_settings(s3, f"layout-{nonce}"), "cluster": redis.url,
                    "heartbeat_interval_s": "0.5", **node_settings}

        def start(index: int) -> NodeServer:
            ns = names[index]
            return start_server(free_port(), netns=ns.name, host=ns.node_ip,
                                node_id=f"n{index}-{nonce}", **settings)

        started: list[NodeServer] = []
        try:
            with ThreadPoolExecutor(nodes) as pool:
                futures = [pool.submit(start, i) for i in range(nodes)]
            failed = [f.exception() for f in futures if f.exception() is not None]
            started.extend(f.result() for f in futures if f.exception() is None)
            if failed:
                raise failed[0]  # type: ignore[misc]
            scheds = [stack.enter_context(service("scheduler", "--cluster", redis.url, env=env))
                      for _ in range(schedulers)]
            gates = [stack.enter_context(service(
                "gateway", "--cluster", redis.url, "--scheduler", scheds[i % schedulers].url,
                "--api-key", API_KEY, env=env)) for i in range(gateways)]
            yield Layout(nonce, redis, s3, started, scheds, gates, names)
            for svc in (*gates, *scheds):
                assert "Traceback" not in svc.log(), svc.log()[-3000:]
        finally:
            stack.close()
            for node in started:
                stop_node(node)
