"""Pause on node A, ``kill -9`` A, resume through the gateway: the sandbox lands on node B
with its files and its processes, from the shared repository (a real S3 server process)."""

from __future__ import annotations

import os
import secrets
import time

import pytest
from e2b import Sandbox

from tests.cluster.services import service
from tests.cluster.test_gateway import node_of
from tests.conftest import free_port
from tests.redis_server import RedisServer
from tests.s3 import run_s3_server
from tests.server.harness import API_KEY, NodeServer, cleanup_home, kill_leaked, start_server
from tests.server.test_shared_repository import (
    crash_and_scrub,
    pause_until_published,
    s3_settings,
    start_counter,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]


def _stop(node: NodeServer) -> None:
    if node.process.poll() is None:
        node.stop()
    kill_leaked(node.home)
    cleanup_home(node.home)


def test_a_paused_sandbox_of_a_dead_node_resumes_on_another(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    nonce = secrets.token_hex(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with run_s3_server() as s3:
        settings = {**s3_settings(s3, f"move-{nonce}"), "cluster": redis_server.url,
                    "heartbeat_interval_s": "0.5"}
        a = start_server(free_port(), node_id=f"mv-a-{nonce}", **settings)
        b: NodeServer | None = None
        try:
            with service("scheduler", "--cluster", redis_server.url, env=env) as scheduler, \
                 service("gateway", "--cluster", redis_server.url, "--scheduler",
                         scheduler.url, "--api-key", API_KEY, env=env) as gateway:
                for key, value in (("E2B_API_URL", gateway.url),
                                   ("E2B_SANDBOX_URL", gateway.url), ("E2B_API_KEY", API_KEY)):
                    monkeypatch.setenv(key, value)
                monkeypatch.delenv("E2B_DEBUG", raising=False)
                sbx = Sandbox.create(timeout=300)  # A is the only node yet
                assert node_of(redis_server, sbx.sandbox_id) == f"mv-a-{nonce}"
                b = start_server(free_port(), node_id=f"mv-b-{nonce}", **settings)
                sbx.files.write("/home/user/kept.txt", f"files-{nonce}")
                start_counter(sbx)
                before = int(sbx.files.read("/tmp/count").strip())
                pause_until_published(a, sbx)
                crash_and_scrub(a)
                started = time.monotonic()
                resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
                took = time.monotonic() - started
                assert node_of(redis_server, sbx.sandbox_id) == f"mv-b-{nonce}"
                assert resumed.files.read("/home/user/kept.txt") == f"files-{nonce}"
                first = int(resumed.files.read("/tmp/count").strip())
                time.sleep(0.5)
                second = int(resumed.files.read("/tmp/count").strip())
                assert second > first >= before, (before, first, second)
                print(f"resumed on B {took:.2f} s after A died")
                resumed.kill()
                assert "Traceback" not in gateway.log(), gateway.log()[-3000:]
        finally:
            if b is not None:
                _stop(b)
            if a.home.exists():
                _stop(a)


def test_a_fork_from_a_full_node_places_children_on_another(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from aenv.client.sync import Client

    nonce = secrets.token_hex(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with run_s3_server() as s3:
        settings = {**s3_settings(s3, f"fork-{nonce}"), "cluster": redis_server.url,
                    "heartbeat_interval_s": "0.5"}
        a = start_server(free_port(), node_id=f"fk-a-{nonce}", max_sandboxes="3", **settings)
        b: NodeServer | None = None
        try:
            with service("scheduler", "--cluster", redis_server.url, env=env) as scheduler, \
                 service("gateway", "--cluster", redis_server.url, "--scheduler",
                         scheduler.url, "--api-key", API_KEY, env=env) as gateway, \
                 Client(api_url=gateway.url, api_key=API_KEY, sandbox_url=gateway.url,
                        deadline_s=60) as client:
                parent = client.create("base", timeout=300)  # A is the only node yet
                assert node_of(redis_server, parent.sandbox_id) == f"fk-a-{nonce}"
                parent.write_file("/home/user/kept.txt", f"parent-{nonce}")
                b = start_server(free_port(), node_id=f"fk-b-{nonce}", **settings)
                children = client.fork(parent.sandbox_id, 8, timeout=300)
                assert len(children) == 8 and not children.errors, children.errors
                where = [node_of(redis_server, c.sandbox_id) for c in children]
                # A holds the parent and two children (its limit is 3); B the other six.
                assert where.count(f"fk-a-{nonce}") == 2, where
                assert where.count(f"fk-b-{nonce}") == 6, where
                for child in children:
                    assert child.read_file("/home/user/kept.txt") == f"parent-{nonce}"
                    assert child.run("echo child").stdout == "child\n"
                for child in children:
                    child.kill()
                parent.kill()
                assert "Traceback" not in gateway.log(), gateway.log()[-3000:]
        finally:
            if b is not None:
                _stop(b)
            _stop(a)


def test_drain_moves_every_sandbox_to_another_node(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from tests.cli_run import AENV

    nonce = secrets.token_hex(4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with run_s3_server() as s3:
        settings = {**s3_settings(s3, f"drain-{nonce}"), "cluster": redis_server.url,
                    "heartbeat_interval_s": "0.5"}
        a = start_server(free_port(), node_id=f"dr-a-{nonce}", **settings)
        b: NodeServer | None = None
        try:
            with service("scheduler", "--cluster", redis_server.url, env=env) as scheduler, \
                 service("gateway", "--cluster", redis_server.url, "--scheduler",
                         scheduler.url, "--api-key", API_KEY, env=env) as gateway:
                for key, value in (("E2B_API_URL", gateway.url),
                                   ("E2B_SANDBOX_URL", gateway.url), ("E2B_API_KEY", API_KEY)):
                    monkeypatch.setenv(key, value)
                monkeypatch.delenv("E2B_DEBUG", raising=False)
                moving = [Sandbox.create(timeout=300) for _ in range(2)]  # A is alone yet
                for sbx in moving:
                    sbx.files.write("/home/user/kept.txt", sbx.sandbox_id)
                    start_counter(sbx)
                b = start_server(free_port(), node_id=f"dr-b-{nonce}", **settings)
                drained = subprocess.run(
                    [str(AENV), "node", "drain", f"dr-a-{nonce}", "--cluster", redis_server.url],
                    env={**env, "E2B_API_URL": gateway.url, "E2B_API_KEY": API_KEY},
                    capture_output=True, text=True, timeout=300, check=False)
                assert drained.returncode == 0, drained.stderr
                assert sorted(drained.stdout.split()) == sorted(s.sandbox_id for s in moving)
                for sbx in moving:
                    assert node_of(redis_server, sbx.sandbox_id) == f"dr-b-{nonce}"
                    again = Sandbox.connect(sbx.sandbox_id, timeout=120)
                    assert again.files.read("/home/user/kept.txt") == sbx.sandbox_id
                    first = int(again.files.read("/tmp/count").strip())
                    time.sleep(0.3)
                    assert int(again.files.read("/tmp/count").strip()) > first
                # Nothing new goes to the draining node.
                fresh = Sandbox.create(timeout=60)
                assert node_of(redis_server, fresh.sandbox_id) == f"dr-b-{nonce}"
                fresh.kill()
                for sbx in moving:
                    Sandbox.connect(sbx.sandbox_id).kill()
                assert "Traceback" not in gateway.log(), gateway.log()[-3000:]
        finally:
            if b is not None:
                _stop(b)
            _stop(a)
