"""Two nodes of one cluster behind a scheduler and a gateway, over a shared repository (a real
S3 server process), each node in a network namespace of its own: where sandboxes move."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.cluster.layout import Namespace
from tests.cluster.services import Service, service
from tests.conftest import free_port
from tests.redis_server import RedisServer
from tests.s3 import run_s3_server
from tests.server.harness import API_KEY, NodeServer, cleanup_home, kill_leaked, start_server
from tests.server.test_shared_repository import s3_settings


def stop_node(node: NodeServer) -> None:
    if node.process.poll() is None:
        node.stop()
    kill_leaked(node.home)
    cleanup_home(node.home)


@dataclass
class Cluster:
    """Node A (started first, alone), a scheduler and a gateway; ``start_b`` adds node B."""

    nonce: str
    a: NodeServer
    gateway: Service
    start_b: Callable[[], NodeServer]

    def name(self, node: str) -> str:
        return f"{node}-{self.nonce}"


@contextlib.contextmanager
def cluster(redis_server: RedisServer, hub: tuple[str, list[Namespace]],
            monkeypatch: pytest.MonkeyPatch, tag: str, **a_settings: str) -> Iterator[Cluster]:
    """Each node in a network namespace of its own; the SDK is pointed at the gateway
    meanwhile; both nodes are stopped at the end."""
    nonce = secrets.token_hex(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    hub_ip, (ns_a, ns_b, _) = hub
    with run_s3_server(host=hub_ip) as s3:
        settings = {**s3_settings(s3, f"{tag}-{nonce}"), "cluster": redis_server.url,
                    "heartbeat_interval_s": "0.5", "webhook_allow_private": "true"}
        a = start_server(free_port(), netns=ns_a.name, host=ns_a.node_ip,
                         node_id=f"{tag}-a-{nonce}", **settings, **a_settings)
        started: list[NodeServer] = []

        def start_b() -> NodeServer:
            started.append(start_server(free_port(), netns=ns_b.name, host=ns_b.node_ip,
                                        node_id=f"{tag}-b-{nonce}", **settings))
            return started[-1]

        try:
            with service("scheduler", "--cluster", redis_server.url, env=env) as scheduler, \
                 service("gateway", "--cluster", redis_server.url, "--scheduler",
                         scheduler.url, "--api-key", API_KEY, env=env) as gateway:
                for key, value in (("E2B_API_URL", gateway.url),
                                   ("E2B_SANDBOX_URL", gateway.url), ("E2B_API_KEY", API_KEY)):
                    monkeypatch.setenv(key, value)
                monkeypatch.delenv("E2B_DEBUG", raising=False)
                yield Cluster(nonce, a, gateway, start_b)
                assert "Traceback" not in gateway.log(), gateway.log()[-3000:]
        finally:
            for node in started:
                stop_node(node)
            if a.home.exists():
                stop_node(a)
