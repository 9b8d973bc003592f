"""The teams' usage across a cluster, in a real Redis (``cluster/team_usage.py``): the ledger
each node checks a team's quota against. Three nodes' gates (``QuotaGate`` with the shared
ledger) racing 40 starts take exactly what the quota leaves; a start is counted by its hold,
then by its node's publication, never zero times; an older publication never replaces a
newer; a lost node's usage and an expired hold stop counting; Redis down leaves each node
its own limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import connect
from aenv.cluster.registry import now_ms
from aenv.cluster.team_usage import ClusterTeamUsage
from aenv.core.errors import QuotaExceeded
from aenv.core.states import SandboxState
from aenv.orchestrator.team_quota import Quota, QuotaGate, Usage
from aenv.store.models import SandboxRecord
from tests.conftest import free_port

pytestmark = pytest.mark.anyio
MEMORY = 512
DISK = 1024


def _record(n: int, team: str, state: SandboxState = SandboxState.RUNNING) -> SandboxRecord:
    return SandboxRecord(sandbox_id=f"s{n}", template_id="base", state=state, version=1,
                         created_at=0, started_at=0, end_at=0, cpu_count=1,
                         memory_mb=MEMORY, disk_size_mb=DISK, envd_token="t",
                         client_id="c", team_id=team)


async def _beat(redis: Redis, keys: Keys, node_id: str, age_ms: int = 0) -> None:
    """What the ledger reads of a node's heartbeat: that it is one, and when."""
    await redis.sadd(keys.nodes, node_id)
    await redis.hset(keys.node(node_id), "heartbeat_ms", await now_ms(redis) - age_ms)


async def _usage(redis: Redis, keys: Keys, node_id: str, team: str) -> Usage | None:
    raw = await redis.hget(keys.team_usage(node_id), team)
    if raw is None:
        return None
    _, count, memory, disk = (int(v) for v in raw.split(":"))
    return Usage(count, memory, disk)


async def test_forty_starts_on_three_nodes_take_exactly_what_the_quota_leaves(
        redis: Redis, keys: Keys) -> None:
    """Each node's gate sees only its own records, so only the ledger can hold the team to
    its memory across the three; each start writes its record inside the gate, as a
    create does, and is then counted by its node's publication."""
    nodes = [f"n{i}" for i in range(3)]
    for node in nodes:
        await _beat(redis, keys, node)
    stores: dict[str, list[SandboxRecord]] = {node: [] for node in nodes}
    # Already running: two of the team's on n0, published by its last heartbeat.
    stores["n0"] += [_record(900, "team-a"), _record(901, "team-a")]
    await ClusterTeamUsage(redis, keys, "n0").publish_all(
        {"team-a": Usage.of(stores["n0"])}, await now_ms(redis))
    gates = {node: QuotaGate(shared=ClusterTeamUsage(redis, keys, node)) for node in nodes}
    quota = Quota(max_memory_mb=8 * MEMORY)
    started = 0

    async def start(n: int) -> bool:
        nonlocal started
        node = nodes[n % 3]
        store = stores[node]

        async def records() -> list[SandboxRecord]:
            return [r for r in store if r.team_id == "team-a"]

        try:
            async with gates[node].admit(quota, "team-a", records, count=1,
                                         memory_mb=MEMORY, disk_mb=DISK):
                await asyncio.sleep(0.01 * (n % 4))  # the boot
                store.append(_record(n, "team-a"))
                started += 1
        except QuotaExceeded as exc:
            assert "quota of 4096 MB of memory" in exc.message
            assert exc.retry_after_s
            return False
        return True

    answers = await asyncio.gather(*(start(n) for n in range(40)))
    assert sum(answers) == 6 == started  # eight of 512 MB, two of them running before
    assert sum(len(s) for s in stores.values()) == 8
    assert await redis.zcard(keys.team_held("team-a")) == 0  # every hold released
    assert sum(bool(s) for s in stores.values()) >= 2  # the starts went to several nodes
    for node in nodes:  # and each node's publication counts its own
        mine = Usage.of(stores[node])
        assert (await _usage(redis, keys, node, "team-a") or Usage()) == mine, node
    # Full: one more is refused on any node; another team is not held by this one's quota.
    with pytest.raises(QuotaExceeded, match="across the cluster"):
        await ClusterTeamUsage(redis, keys, "n2").hold("team-a", quota, Usage(1, MEMORY, 0))
    await ClusterTeamUsage(redis, keys, "n2").hold("team-b", quota, Usage(1, MEMORY, 0))


async def test_a_kill_frees_the_quota_at_its_publication(redis: Redis, keys: Keys) -> None:
    await _beat(redis, keys, "n0")
    ledger = ClusterTeamUsage(redis, keys, "n0")
    quota = Quota(max_sandboxes=2)
    records = [_record(1, "t"), _record(2, "t")]
    await ledger.publish("t", Usage.of(records), await now_ms(redis))
    with pytest.raises(QuotaExceeded, match="2 running sandboxes across the cluster"):
        await ledger.hold("t", quota, Usage(1, MEMORY, DISK))
    records[1] = _record(2, "t", SandboxState.KILLING)
    await ledger.publish("t", Usage.of(records), await now_ms(redis))
    await ledger.hold("t", quota, Usage(1, MEMORY, DISK))


async def test_paused_sandboxes_hold_disk_but_not_memory(redis: Redis, keys: Keys) -> None:
    await _beat(redis, keys, "n0")
    ledger = ClusterTeamUsage(redis, keys, "n0")
    paused = [_record(1, "t", SandboxState.PAUSED), _record(2, "t", SandboxState.PAUSED)]
    await ledger.publish("t", Usage.of(paused), await now_ms(redis))
    assert await _usage(redis, keys, "n0", "t") == Usage(0, 0, 2 * DISK)
    await ledger.hold("t", Quota(max_sandboxes=1, max_memory_mb=MEMORY), Usage(1, MEMORY, 0))
    with pytest.raises(QuotaExceeded, match=f"{3 * DISK} MB of disk across the cluster"):
        await ledger.hold("t", Quota(max_disk_mb=3 * DISK), Usage(1, MEMORY, DISK + 1))


async def test_an_older_publication_never_replaces_a_newer(redis: Redis, keys: Keys) -> None:
    """Two starts of one node finish in the opposite order of their clocks: the later
    write carries the earlier listing, which may miss the other's sandbox."""
    ledger = ClusterTeamUsage(redis, keys, "n0")
    await ledger.publish("t", Usage(3, 3 * MEMORY, 0), 2_000)
    await ledger.publish("t", Usage(1, MEMORY, 0), 1_000)
    assert await _usage(redis, keys, "n0", "t") == Usage(3, 3 * MEMORY, 0)
    # A heartbeat measured before that publication leaves the team alone...
    await ledger.publish_all({"u": Usage(1, 0, 0)}, 1_500)
    assert await _usage(redis, keys, "n0", "t") == Usage(3, 3 * MEMORY, 0)
    # ...one measured after it, finding nothing of the team's, drops it.
    await ledger.publish_all({"u": Usage(1, 0, 0)}, 2_500)
    assert await _usage(redis, keys, "n0", "t") is None
    assert await _usage(redis, keys, "n0", "u") == Usage(1, 0, 0)


async def test_a_lost_node_and_an_expired_hold_stop_counting(redis: Redis, keys: Keys) -> None:
    await _beat(redis, keys, "n0")
    await _beat(redis, keys, "gone", age_ms=10_000)
    await ClusterTeamUsage(redis, keys, "gone").publish("t", Usage(5, 0, 0), 1)
    ledger = ClusterTeamUsage(redis, keys, "n0", hold_ttl_ms=300, lost_after_s=5)
    quota = Quota(max_sandboxes=1)
    await ledger.hold("t", quota, Usage(1, 0, 0))  # the lost node's five are not counted
    with pytest.raises(QuotaExceeded):
        await ledger.hold("t", quota, Usage(1, 0, 0))  # the open hold is
    await asyncio.sleep(0.4)  # its node died before releasing it
    await ledger.hold("t", quota, Usage(1, 0, 0))


@contextlib.contextmanager
def _warnings(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    seen: list[str] = []
    with caplog.at_level("WARNING", logger="aenv.orchestrator.team_quota"):
        yield seen
        seen += [r.getMessage() for r in caplog.records]


async def test_redis_down_leaves_each_node_its_own_limits(
        keys: Keys, caplog: pytest.LogCaptureFixture) -> None:
    down = connect(f"redis://127.0.0.1:{free_port()}/0")
    gate = QuotaGate(shared=ClusterTeamUsage(down, keys, "n0"))
    store: list[SandboxRecord] = []

    async def records() -> list[SandboxRecord]:
        return list(store)

    with _warnings(caplog) as seen:
        async with gate.admit(Quota(max_sandboxes=1), "t", records, count=1,
                              memory_mb=MEMORY, disk_mb=0):
            store.append(_record(1, "t"))
        with pytest.raises(QuotaExceeded, match="quota of 1 running sandboxes is reached"):
            async with gate.admit(Quota(max_sandboxes=1), "t", records, count=1,
                                  memory_mb=MEMORY, disk_mb=0):
                pass
    await down.aclose()
    assert len([m for m in seen if "cannot be reached" in m]) == 1, seen


async def test_a_publication_of_the_same_millisecond_replaces_the_one_held(
        redis: Redis, keys: Keys) -> None:
    await _beat(redis, keys, "n0")
    ledger = ClusterTeamUsage(redis, keys, "n0")
    at = await now_ms(redis)
    await ledger.publish("t", Usage.of([_record(1, "t"), _record(2, "t")]), at)
    await ledger.publish("t", Usage.of([_record(1, "t")]), at)  # a kill, the same ms
    await ledger.hold("t", Quota(max_sandboxes=2), Usage(1, MEMORY, DISK))
    await ledger.publish("t", Usage.of([_record(1, "t"), _record(2, "t")]), at - 1)  # stale
    await ledger.hold("t", Quota(max_sandboxes=3), Usage(1, MEMORY, DISK))
