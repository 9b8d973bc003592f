"""Peer fetch (``peer_fetch = true``): a node creating from a snapshot another node made
takes the snapshot's blobs from that node, not from the shared repository (a real S3 server
process: its request log shows which blobs were read from it); with that node gone, from
the repository. And the node's blob route answers what it has, 404 what it has not, 400 a
malformed digest."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.cluster.layout import stop_node
from tests.conftest import free_port
from tests.redis_server import RedisServer
from tests.s3 import S3Server, run_s3_server
from tests.server.harness import API_KEY, NodeServer, start_server
from tests.server.test_shared_repository import s3_settings, sdk_env

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]


def _blob_reads(s3: S3Server, prefix: str, since: int) -> int:
    """GETs of blobs under ``prefix`` in the S3 server's log after byte ``since``."""
    return len(re.findall(rf'"GET /{s3.bucket}/{prefix}/blobs/sha256/[0-9a-f]+',
                          s3.log()[since:]))


@pytest.fixture
def nodes(redis_server: RedisServer) -> Iterator[tuple[S3Server, str, NodeServer, NodeServer]]:
    prefix = f"peer-{secrets.token_hex(4)}"
    with run_s3_server() as s3:
        settings = {**s3_settings(s3, prefix), "cluster": redis_server.url,
                    "heartbeat_interval_s": "0.5"}
        a = start_server(free_port(), node_id=f"{prefix}-a", **settings)
        b: NodeServer | None = None
        try:
            b = start_server(free_port(), node_id=f"{prefix}-b", peer_fetch="true", **settings)
            yield s3, prefix, a, b
        finally:
            for node in (a, b):
                if node is not None:
                    stop_node(node)


def test_blobs_come_from_the_node_that_has_them_then_from_the_repository(
        nodes: tuple[S3Server, str, NodeServer, NodeServer]) -> None:
    s3, prefix, a, b = nodes
    with sdk_env(a):
        source = Sandbox.create(timeout=300)
        source.files.write("/home/user/kept.txt", prefix)
        first = source.create_snapshot(name=f"first-{prefix}")
        source.files.write("/home/user/kept.txt", f"second-{prefix}")
        second = source.create_snapshot(name=f"second-{prefix}")
        source.kill()
    mark = len(s3.log())
    with sdk_env(b):
        child = Sandbox.create(first.snapshot_id, timeout=120)
        assert child.files.read("/home/user/kept.txt") == prefix
        child.kill()
    assert "from peer" in b.log()
    assert _blob_reads(s3, prefix, mark) == 0, s3.log()[mark:][-2000:]
    # A gone (its heartbeat still fresh): the asks fail, the repository serves.
    stop_node(a)
    mark = len(s3.log())
    with sdk_env(b):
        child = Sandbox.create(second.snapshot_id, timeout=120)
        assert child.files.read("/home/user/kept.txt") == f"second-{prefix}"
        child.kill()
    assert _blob_reads(s3, prefix, mark) > 0


def test_the_blob_route(nodes: tuple[S3Server, str, NodeServer, NodeServer]) -> None:
    _, _, a, _ = nodes
    cached = sorted((a.home / "cache" / "blobs" / "sha256").iterdir())[0]
    digest = f"sha256:{cached.name}"
    with httpx.Client(base_url=a.url, headers={"X-API-KEY": API_KEY}, timeout=30) as client:
        got = client.get(f"/node/blobs/{digest}")
        assert got.status_code == 200 and got.content == cached.read_bytes()
        assert client.head(f"/node/blobs/{digest}").status_code == 200
        assert client.get(f"/node/blobs/sha256:{'0' * 64}").status_code == 404
        assert client.get("/node/blobs/sha256:nothex").status_code == 400
        assert httpx.get(f"{a.url}/node/blobs/{digest}").status_code == 401
