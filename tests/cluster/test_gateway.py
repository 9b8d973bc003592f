"""The E2B SDK pointed at a gateway in front of two real nodes, a real scheduler process and
a real Redis: creates spread over the nodes, commands and files reach the right node, the
list merges both nodes with correct pagination, kills unbind, unknown ids are E2B 404s."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, RateLimitException

from aenv.cluster.keys import Keys
from tests.cluster.services import Service, service
from tests.redis_server import RedisServer
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = pytest.mark.gvisor


@pytest.fixture(scope="module")
def nodes(redis_server: RedisServer) -> Iterator[list[NodeServer]]:
    with serving(cluster=redis_server.url, node_id="gw-a", heartbeat_interval_s="0.5",
                 max_sandboxes="2") as a, \
         serving(cluster=redis_server.url, node_id="gw-b", heartbeat_interval_s="0.5",
                 max_sandboxes="2") as b:
        yield [a, b]


@pytest.fixture(scope="module")
def gateway(nodes: list[NodeServer], redis_server: RedisServer) -> Iterator[Service]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
    with service("scheduler", "--cluster", redis_server.url, env=env) as scheduler, \
         service("gateway", "--cluster", redis_server.url, "--scheduler", scheduler.url,
                 "--api-key", API_KEY, env=env) as gw:
        yield gw


@pytest.fixture
def sdk(gateway: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", gateway.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", gateway.url)
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    monkeypatch.delenv("E2B_DEBUG", raising=False)


def test_sdk_through_the_gateway(sdk: None, gateway: Service, redis_server: RedisServer) -> None:
    from redis import Redis

    sandboxes = [Sandbox.create(timeout=120, metadata={"run": "gw"}) for _ in range(4)]
    try:
        client = Redis.from_url(redis_server.url, decode_responses=True)
        placed = {s.sandbox_id: client.hget(Keys().binding(s.sandbox_id), "node")
                  for s in sandboxes}
        client.close()
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
