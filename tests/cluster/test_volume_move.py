"""A volume across a cluster (nodes in network namespaces of their own, a real S3 server as the
shared repository, the gateway in front): written by a sandbox on node A, read by sandboxes
the scheduler places on A while A holds it, then — A gone — read by a sandbox the gateway
placed on node B, and through the content API."""

from __future__ import annotations

import secrets
import time

import httpx
import pytest
from e2b import Sandbox, Volume

from tests.cluster.layout import Namespace
from tests.cluster.test_gateway import node_of
from tests.cluster.two_nodes import cluster, stop_node
from tests.redis_server import RedisServer
from tests.server.harness import API_KEY

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]


def test_a_volume_written_on_one_node_is_read_on_another(
        redis_server: RedisServer, hub: tuple[str, list[Namespace]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    with cluster(redis_server, hub, monkeypatch, "vol", volume_idle_release_s="1") as c:
        monkeypatch.setenv("E2B_VOLUME_API_URL", c.gateway.url)
        vol = Volume.create(f"moving-{c.nonce}")
        payload = secrets.token_hex(200_000)
        writer = Sandbox.create(timeout=120, volume_mounts={"/data": vol})
        assert node_of(redis_server, writer.sandbox_id) == c.name("vol-a")
        writer.files.write("/data/payload.txt", payload)
        writer.commands.run("mkdir -p /data/sub && echo nested > /data/sub/f", timeout=30)
        c.start_b()
        # While A holds the volume, readers are placed on A (on B the volume could not be
        # mounted: A has it), however the load falls.
        time.sleep(1.5)  # B's heartbeats, and A's naming the volume, reach the scheduler
        readers = []
        for _ in range(3):
            made = httpx.post(f"{c.gateway.url}/sandboxes", headers={"X-API-KEY": API_KEY},
                              timeout=120, json={"templateID": "base", "timeout": 60,
                                                 "volumeMounts": [{"name": vol.name,
                                                                   "path": "/data",
                                                                   "readOnly": True}]})
            assert made.status_code == 201, made.text
            readers.append(Sandbox.connect(made.json()["sandboxID"]))
        try:
            for reader in readers:
                assert node_of(redis_server, reader.sandbox_id) == c.name("vol-a")
                assert reader.files.read("/data/sub/f") == "nested\n"
        finally:
            for reader in readers:
                reader.kill()
        writer.kill()
        # A stops: its volumes go back to the repository on the way out.
        stop_node(c.a)
        reader = Sandbox.create(timeout=120, volume_mounts={"/data": vol.name})
        try:
            assert node_of(redis_server, reader.sandbox_id) == c.name("vol-b")
            assert reader.files.read("/data/payload.txt") == payload
            assert reader.commands.run("cat /data/sub/f", timeout=30).stdout == "nested\n"
        finally:
            reader.kill()
        assert Volume.connect(vol.volume_id).read_file("/sub/f") == "nested\n"
        assert vol.name in {v.name for v in Volume.list()}
        assert Volume.destroy(vol.volume_id)
