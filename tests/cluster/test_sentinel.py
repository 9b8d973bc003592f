"""Redis Sentinel (production HA, docs/deployment.md): a node, a scheduler and a gateway
joined through ``redis+sentinel://`` keep serving across a failover. The master is killed
(SIGKILL); the sentinels promote the replica; the node's heartbeats, the gateway's calls on
a sandbox made before and a create after all go to the new master."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from e2b import Sandbox
from redis import Redis

from aenv.cluster.keys import Keys
from tests.cluster.services import service
from tests.redis_sentinel import sentinel_group
from tests.server.harness import API_KEY, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(300)]


def _eventually(what: str, check: Callable[[], object], timeout_s: float = 30.0) -> object:
    """``check()``'s first true answer; failures and false answers are tried again."""
    deadline = time.monotonic() + timeout_s
    while True:
        failure: Exception | None = None
        try:
            if found := check():
                return found
        except Exception as exc:  # the cluster may fail calls while it fails over
            failure = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not so after {timeout_s} s") from failure
        time.sleep(0.2)


def _heartbeat_ms(redis: Redis) -> int:
    return int(redis.hget(Keys().node("sentinel-node"), "heartbeat_ms") or 0)  # type: ignore[arg-type]


def test_the_cluster_follows_a_sentinel_failover(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with sentinel_group() as group, \
         serving(cluster=group.url, node_id="sentinel-node", heartbeat_interval_s="0.5"), \
         service("scheduler", "--cluster", group.url, env=env) as scheduler, \
         service("gateway", "--cluster", group.url, "--scheduler", scheduler.url,
                 "--api-key", API_KEY, env=env) as gateway:
        for key, value in (("E2B_API_URL", gateway.url), ("E2B_SANDBOX_URL", gateway.url)):
            monkeypatch.setenv(key, value)
        before = Sandbox.create(timeout=300)
        assert before.commands.run("echo before").stdout == "before\n"
        group.master.kill()
        killed = time.monotonic()
        group.wait_for_master(group.replica.port)
        promoted = time.monotonic() - killed
        # The promoted replica gets the node's heartbeats...
        new_master = Redis(host="127.0.0.1", port=group.replica.port, decode_responses=True)
        try:
            first = _heartbeat_ms(new_master)
            _eventually("a heartbeat to the new master",
                        lambda: _heartbeat_ms(new_master) > first)
        finally:
            new_master.close()
        # ... and the gateway serves the sandbox made before and a create after.
        _eventually("a call on the sandbox made before",
                    lambda: before.commands.run("echo after").stdout == "after\n")
        after = Sandbox.create(timeout=300)
        assert after.commands.run("echo new").stdout == "new\n"
        served = time.monotonic() - killed
        print(f"failover: replica promoted {promoted:.1f} s after the kill, "
              f"cluster serving again {served:.1f} s after it")
        after.kill()
        before.kill()
        assert "Traceback" not in gateway.log(), gateway.log()[-3000:]
        assert "Traceback" not in scheduler.log(), scheduler.log()[-3000:]
