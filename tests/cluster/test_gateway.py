"""The E2B SDK pointed at a gateway in front of two real nodes (each in a network namespace
of its own, ``layout.py``), a real scheduler process and a real Redis: creates spread over
the nodes, commands and files reach the right node, the list merges both nodes with correct
pagination, kills unbind, unknown ids are E2B 404s."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, RateLimitException

from aenv.cluster.cache import BINDING_TTL_S
from aenv.cluster.keys import Keys
from tests.cluster.layout import Namespace
from tests.cluster.services import Service, service
from tests.redis_server import RedisServer
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = pytest.mark.gvisor


@pytest.fixture(scope="module")
def nodes(redis_server: RedisServer, hub: tuple[str, list[Namespace]]
          ) -> Iterator[list[NodeServer]]:
    """Two nodes, each in a network namespace of its own with its own address."""
    ns_a, ns_b = hub[1][:2]
    with serving(cluster=redis_server.url, node_id="gw-a", heartbeat_interval_s="0.5",
                 max_sandboxes="2", netns=ns_a.name, host=ns_a.node_ip) as a, \
         serving(cluster=redis_server.url, node_id="gw-b", heartbeat_interval_s="0.5",
                 max_sandboxes="2", netns=ns_b.name, host=ns_b.node_ip) as b:
        yield [a, b]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}


@pytest.fixture(scope="module")
def scheduler(nodes: list[NodeServer], redis_server: RedisServer) -> Iterator[Service]:
    with service("scheduler", "--cluster", redis_server.url, env=_env()) as svc:
        yield svc


@pytest.fixture(scope="module")
def gateway(scheduler: Service, redis_server: RedisServer) -> Iterator[Service]:
    with service("gateway", "--cluster", redis_server.url, "--scheduler", scheduler.url,
                 "--api-key", API_KEY, env=_env()) as gw:
        yield gw


def node_of(redis_server: RedisServer, sandbox_id: str) -> str | None:
    from redis import Redis

    client = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        return client.hget(Keys().binding(sandbox_id), "node")
    finally:
        client.close()


@pytest.fixture
def sdk(gateway: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", gateway.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", gateway.url)
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    monkeypatch.delenv("E2B_DEBUG", raising=False)


def test_sdk_through_the_gateway(sdk: None, gateway: Service, redis_server: RedisServer) -> None:
    sandboxes = [Sandbox.create(timeout=120, metadata={"run": "gw"}) for _ in range(4)]
    try:
        placed = {s.sandbox_id: node_of(redis_server, s.sandbox_id) for s in sandboxes}
        # Two per node: each node's limit is 2.
        assert sorted(placed.values()) == ["gw-a", "gw-a", "gw-b", "gw-b"], placed
        for sbx in sandboxes:
            sbx.files.write("/tmp/who", sbx.sandbox_id)
            assert sbx.files.read("/tmp/who") == sbx.sandbox_id
            out = sbx.commands.run("cat /tmp/who; echo; echo err >&2")
            assert out.stdout == sbx.sandbox_id + "\n" and out.stderr == "err\n"
        # The cluster is full: the scheduler's 429 reaches the SDK as a rate limit.
        with pytest.raises(RateLimitException, match="cluster has no room"):
            Sandbox.create(timeout=60)
        # One list over both nodes, paginated: 3 then 1, no duplicates.
        paginator = Sandbox.list(limit=3, query=None)
        first = paginator.next_items()
        assert len(first) == 3 and paginator.has_next
        second = paginator.next_items()
        assert not paginator.has_next
        listed = [s.sandbox_id for s in first + second]
        assert sorted(listed) == sorted(s.sandbox_id for s in sandboxes)
        # connect by id finds the sandbox on its node
        again = Sandbox.connect(sandboxes[3].sandbox_id)
        assert again.commands.run("cat /tmp/who").stdout == sandboxes[3].sandbox_id
    finally:
        for sbx in sandboxes:
            sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandboxes[0].sandbox_id)
    assert "Traceback" not in gateway.log(), gateway.log()[-3000:]


def _nodes(scheduler_url: str) -> dict[str, dict[str, Any]]:
    import httpx

    return {n["node_id"]: n for n in httpx.get(f"{scheduler_url}/v1/nodes").json()}


def _health(scheduler_url: str) -> dict[str, str]:
    return {node_id: n["health"] for node_id, n in _nodes(scheduler_url).items()}


def test_redis_wiped_the_cluster_rebuilds_and_keeps_serving(
        sdk: None, gateway: Service, scheduler: Service, redis_server: RedisServer) -> None:
    import time

    sbx = Sandbox.create(timeout=120)
    try:
        redis_server.restart()  # no persistence: every binding and heartbeat is gone
        # The nodes' next heartbeats register them again (within a few intervals: their
        # clients reconnect with backoff); the sandbox's binding then comes from a roster.
        deadline = time.monotonic() + 10
        while set(_health(scheduler.url)) != {"gw-a", "gw-b"}:
            assert time.monotonic() < deadline, "the nodes did not come back after the wipe"
            time.sleep(0.1)
        assert node_of(redis_server, sbx.sandbox_id) is None
        assert sbx.commands.run("echo still", timeout=30).stdout == "still\n"
        # Once the gateway's cached binding is due, the next call finds it in the roster.
        time.sleep(BINDING_TTL_S)
        assert sbx.commands.run("echo again", timeout=30).stdout == "again\n"
        assert node_of(redis_server, sbx.sandbox_id) is not None
        again = Sandbox.create(timeout=120)
        again.kill()
    finally:
        sbx.kill()


def test_a_hung_node_is_suspect_then_lost_and_the_other_serves(
        sdk: None, nodes: list[NodeServer], gateway: Service, scheduler: Service,
        redis_server: RedisServer) -> None:
    import signal
    import time

    from e2b.exceptions import SandboxException

    b = nodes[1]
    on_b: list[Sandbox] = []
    keep: list[Sandbox] = []
    try:
        for _ in range(4):
            sbx = Sandbox.create(timeout=120)
            (on_b if node_of(redis_server, sbx.sandbox_id) == "gw-b" else keep).append(sbx)
        assert on_b and keep, "both nodes should hold sandboxes (limits of 2 each)"
        b.process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            # Each health as first seen: (seconds since the stop, the heartbeat's age by
            # Redis's clock, the one the scheduler judges by).
            seen: dict[str, tuple[float, float]] = {}
            while "lost" not in seen:
                node = _nodes(scheduler.url)["gw-b"]
                seen.setdefault(node["health"], (time.monotonic() - stopped,
                                                 node["heartbeatAgeMs"] / 1000))
                assert time.monotonic() - stopped < 30, seen
                time.sleep(0.2)
            # Documented bounds (cluster/model.py): suspect 6-8 s, lost 20-22 s after the
            # last heartbeat (every 0.5 s here). The ages are Redis's clock; the upper bounds
            # are this test's own (a step of the wall clock moves the first, not the second).
            assert 6.0 <= seen["suspect"][1] < 20.0 and seen["lost"][1] >= 20.0, seen
            assert seen["suspect"][0] <= 8.5 and seen["lost"][0] <= 22.5, seen
            t0 = time.monotonic()
            with pytest.raises(SandboxException, match="lost"):
                on_b[0].commands.run("true", request_timeout=10)
            assert time.monotonic() - t0 < 3
            for sbx in keep:
                assert sbx.commands.run("echo fine").stdout == "fine\n"
        finally:
            b.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while _health(scheduler.url)["gw-b"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        # Whatever failed above, the next tests get both nodes with no sandboxes of this one.
        for sbx in on_b + keep:
            with contextlib.suppress(Exception):  # after a failure already reported
                sbx.kill()


def test_sandboxes_count_against_their_team(
        sdk: None, gateway: Service, redis_server: RedisServer) -> None:
    """What a scheduler's quota counts: each create through the gateway is added to its
    team's sandboxes (the cluster key is the default team's: by the team's id, never the
    key), a kill removes it."""
    from redis import Redis

    client = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        team_id = str(client.get(Keys().default_team)).replace("-", "")
        sbx = Sandbox.create(timeout=120)
        assert client.zscore(Keys().key_sandboxes(team_id), sbx.sandbox_id) is not None
        assert not client.keys(f"*{API_KEY}*")
        sbx.kill()
        assert client.zscore(Keys().key_sandboxes(team_id), sbx.sandbox_id) is None
    finally:
        client.close()
