"""The cluster's secrets and audit log in a real Redis (``cluster/secret_store.py``,
``cluster/audit_store.py``), held to the same contract as the node's SQLite stores: one
suite runs against both. Then what only a shared store has to get right: two nodes (two
clients) racing for one name or appending at once, the value sealed before it reaches Redis,
the stream bounded, a lost counter, and Redis that cannot be reached (``Unavailable``, never
a Redis error)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from redis.asyncio import Redis

from aenv.cluster import audit_store as redis_audit
from aenv.cluster.audit_store import RedisAuditStore
from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import connect
from aenv.cluster.secret_store import RedisSecretStore
from aenv.core.errors import AlreadyExists, Conflict, Unavailable
from aenv.orchestrator.audit import AuditRows, AuditTrail
from aenv.orchestrator.secrets import SecretRows, Vault
from aenv.store.audit import AuditStore
from aenv.store.models import AuditEntry, SecretRow
from aenv.store.secrets import SecretStore
from aenv.store.sqlite import Store
from tests.conftest import free_port
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio
OPERATOR_KEY = "e2b_" + "5" * 40
VALUE = "sk-live-0123456789abcdef"


def _row(n: int, team: str = "team-a", name: str | None = None) -> SecretRow:
    return SecretRow(f"sec_{n:024x}", team, name or f"s{n}", 1, {"n": str(n)}, 1_000.0 + n,
                     1_000.0 + n, bytes(range(256)) + n.to_bytes(2, "big"))


def _entry(n: int, *, actor: str = "key:aaaaaaaaaaaa", object_id: str | None = "sbx1",
           status: int = 204, team_id: str | None = None) -> AuditEntry:
    return AuditEntry(at=1_000.0 + n, actor=actor, action=f"POST /sandboxes/{{sandbox_id}}/{n}",
                      object_id=object_id, client="10.0.0.1", status=status, team_id=team_id,
                      key_name="default" if team_id else None)


@pytest.fixture(params=["sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[SecretRows, AuditRows]]:
    """The node's stores, then the cluster's (each test its own key prefix)."""
    if request.param == "sqlite":
        store = await Store.open(tmp_path / "state.db")
        try:
            yield SecretStore(store.db), AuditStore(store.db)
        finally:
            await store.close()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    keys: Keys = request.getfixturevalue("keys")
    secrets = RedisSecretStore(connect(server.url), keys)
    audit = RedisAuditStore(connect(server.url), keep=100_000, keys=keys)
    try:
        yield secrets, audit
    finally:
        await secrets.close()
        await audit.close()


async def test_secret_rows_contract(stores: tuple[SecretRows, AuditRows]) -> None:
    rows, _ = stores
    made = [_row(n) for n in (3, 1, 2, 10)]
    for row in made:
        await rows.insert(row)
    await rows.insert(_row(20, team="team-b", name="s1"))  # a name is per team
    with pytest.raises(AlreadyExists):
        await rows.insert(_row(30, name="s2"))
    assert await rows.count("team-a") == 4 and await rows.count("team-b") == 1
    # By id or by name (a name is looked up lower-cased), the team's own only.
    assert await rows.get("team-a", made[0].secret_id) == made[0]
    assert await rows.get("team-a", "S3") == made[0]
    assert await rows.get("team-b", made[0].secret_id) is None
    assert (await rows.get("team-b", "s1") or made[0]).secret_id == _row(20).secret_id
    assert await rows.get("team-a", "nope") is None
    # Bytewise name order, paged by the last name seen.
    assert [r.name for r in await rows.list("team-a", after=None, limit=10)] == \
        ["s1", "s10", "s2", "s3"]
    first = await rows.list("team-a", after=None, limit=2)
    assert [r.name for r in first] == ["s1", "s10"]
    assert [r.name for r in await rows.list("team-a", after=first[-1].name, limit=2)] == \
        ["s2", "s3"]
    assert await rows.list("team-a", after="s3", limit=2) == []
    assert [r.name for r in await rows.list("team-a", after="s10x", limit=5)] == ["s2", "s3"]
    # A new version; the row otherwise as it was.
    updated = SecretRow(made[1].secret_id, "team-a", "s1", 2, {}, made[1].created_at, 2_000.0,
                        b"\x00sealed-2")
    await rows.update(updated)
    assert await rows.get("team-a", "s1") == updated
    # Deleted: gone by id and name, from the list and the count; its name free again.
    await rows.delete(made[1].secret_id)
    await rows.delete(made[1].secret_id)
    assert await rows.get("team-a", "s1") is None
    assert await rows.get("team-a", made[1].secret_id) is None
    assert [r.name for r in await rows.list("team-a", after=None, limit=10)] == \
        ["s10", "s2", "s3"]
    assert await rows.count("team-a") == 3
    await rows.update(updated)  # a secret deleted meanwhile stays deleted
    assert await rows.get("team-a", "s1") is None
    await rows.insert(_row(40, name="s1"))
    assert (await rows.get("team-a", "s1") or made[0]).secret_id == _row(40).secret_id
    assert (await rows.get("team-b", "s1") or made[0]).secret_id == _row(20).secret_id


async def test_audit_rows_contract(stores: tuple[SecretRows, AuditRows]) -> None:
    _, audit = stores
    await audit.append([_entry(n) for n in range(5)])
    await audit.append([_entry(5, actor="anonymous", object_id=None, status=401),
                        _entry(6, object_id="sbx2", status=404, team_id="team-a")])
    await audit.append([])
    newest = await audit.query(limit=3)
    assert [e.seq for e in newest] == [7, 6, 5]
    assert newest[0] == replace(_entry(6, object_id="sbx2", status=404, team_id="team-a"),
                                seq=7)
    assert (newest[1].actor, newest[1].object_id, newest[1].status) == ("anonymous", None, 401)
    assert [e.seq for e in await audit.query(limit=3, before=5)] == [4, 3, 2]
    assert [e.seq for e in await audit.query(limit=3, before=2)] == [1]
    assert await audit.query(limit=3, before=1) == []
    assert [e.seq for e in await audit.query(limit=10, object_id="sbx2")] == [7]
    assert [e.seq for e in await audit.query(limit=10, actor="anonymous")] == [6]
    assert [e.seq for e in await audit.query(limit=10, team_id="team-a")] == [7]
    assert [e.seq for e in await audit.query(limit=2, object_id="sbx1", before=4)] == [3, 2]
    assert await audit.query(limit=10, object_id="sbx1", actor="anonymous") == []


async def test_two_nodes_racing_for_one_name_make_one_secret(
        redis_server: RedisServer, keys: Keys) -> None:
    nodes = [RedisSecretStore(connect(redis_server.url), keys) for _ in range(2)]
    try:
        results = await asyncio.gather(
            *(nodes[n % 2].insert(_row(n, name="shared")) for n in range(20)),
            return_exceptions=True)
        assert sum(r is None for r in results) == 1
        assert all(isinstance(r, AlreadyExists) for r in results if r is not None)
        assert await nodes[1].count("team-a") == 1
        # Deletes racing creates never leave a name pointing nowhere.
        [kept] = await nodes[0].list("team-a", after=None, limit=10)
        await asyncio.gather(nodes[0].delete(kept.secret_id),
                             nodes[1].insert(_row(99, name="other")))
        assert [r.name for r in await nodes[1].list("team-a", after=None, limit=10)] == \
            ["other"]
    finally:
        for node in nodes:
            await node.close()


async def test_a_vault_on_one_node_opens_what_another_sealed_and_redis_holds_no_value(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    a = Vault(RedisSecretStore(connect(redis_server.url), keys), OPERATOR_KEY)
    b = Vault(RedisSecretStore(connect(redis_server.url), keys), OPERATOR_KEY)
    try:
        made = await a.create("team-a", "OpenAI", VALUE, {"owner": "rl"})
        assert await b.reveal("team-a", "openai") == VALUE
        assert (await b.get("team-a", made.secret_id)).name == "openai"
        with pytest.raises(Conflict):
            await b.create("team-a", "openai", "x")
        await b.update("team-a", "openai", VALUE + "-2")
        assert await a.reveal("team-a", "openai") == VALUE + "-2"
        # Every key the store wrote: the value is nowhere in the clear.
        written = [k async for k in redis.scan_iter(f"{keys.prefix}:*")]
        assert set(written) == {keys.secrets, keys.secret_names("team-a"),
                                keys.secret_order("team-a")}
        dumped = [await redis.hgetall(keys.secrets), await redis.hgetall(
            keys.secret_names("team-a")), await redis.zrange(keys.secret_order("team-a"), 0, -1)]
        assert "openai" in str(dumped) and VALUE not in str(dumped)
        # Another operator key opens nothing.
        other = Vault(RedisSecretStore(connect(redis_server.url), keys), "e2b_" + "6" * 40)
        try:
            with pytest.raises(Conflict):
                await other.reveal("team-a", "openai")
        finally:
            await other.store.close()  # type: ignore[attr-defined]
        await a.delete("team-a", made.secret_id)
        assert await b.reveal("team-a", "openai") is None
        assert [k async for k in redis.scan_iter(f"{keys.prefix}:*")] == []
    finally:
        await a.store.close()  # type: ignore[attr-defined]
        await b.store.close()  # type: ignore[attr-defined]


async def test_two_nodes_trails_make_one_log_with_unique_seqs(
        redis_server: RedisServer, keys: Keys) -> None:
    stores = [RedisAuditStore(connect(redis_server.url), keep=10_000, keys=keys)
              for _ in range(2)]
    trails = [AuditTrail(s, keep=10_000) for s in stores]
    try:
        for n in range(300):
            trails[n % 2].record(_entry(n, object_id=f"node{n % 2}"))
        await asyncio.gather(*(t.flush() for t in trails))
        # Written by one, read by the other: all of both, seqs 1..300 once each.
        everything = await trails[1].query(limit=1000)
        assert [e.seq for e in everything] == list(range(300, 0, -1))
        assert {e.object_id for e in everything} == {"node0", "node1"}
        mine = await trails[0].query(limit=1000, object_id="node1")
        assert sorted(e.at for e in mine) == [1_000.0 + n for n in range(1, 300, 2)]
    finally:
        for store in stores:
            await store.close()


async def test_a_filtered_read_walks_the_stream_in_chunks(
        redis_server: RedisServer, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_audit, "SCAN_CHUNK", 7)
    monkeypatch.setattr(redis_audit, "APPEND_CHUNK", 9)
    store = RedisAuditStore(connect(redis_server.url), keep=10_000, keys=keys)
    try:
        await store.append([_entry(n, object_id="rare" if n % 25 == 0 else "common")
                            for n in range(100)])
        rare = await store.query(limit=3, object_id="rare")
        assert [e.seq for e in rare] == [76, 51, 26]
        assert [e.seq for e in await store.query(limit=3, object_id="rare",
                                                 before=rare[-1].seq)] == [1]
        assert len(await store.query(limit=1000, object_id="common")) == 96
    finally:
        await store.close()


async def test_the_stream_is_bounded_and_a_lost_counter_goes_on_from_the_newest(
        redis: Redis, redis_server: RedisServer, keys: Keys) -> None:
    store = RedisAuditStore(connect(redis_server.url), keep=200, keys=keys)
    try:
        for start in range(0, 2_000, 250):
            await store.append([_entry(n) for n in range(start, start + 250)])
        # About ``keep``: Redis trims whole nodes of the stream (100 entries by default).
        assert 200 <= await redis.xlen(keys.audit) <= 400
        assert (await store.query(limit=1))[0].seq == 2_000
        assert await store.keep_newest(200) >= 0
        await redis.delete(keys.audit_seq)
        await store.append([_entry(0)])
        assert (await store.query(limit=1))[0].seq == 2_001
    finally:
        await store.close()


async def _refused(call: Callable[[], Awaitable[object]]) -> None:
    with pytest.raises(Unavailable):
        await call()


async def test_redis_that_cannot_be_reached_is_unavailable() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    secrets = RedisSecretStore(connect(url))
    audit = RedisAuditStore(connect(url), keep=100)
    try:
        for call in (lambda: secrets.insert(_row(1)), lambda: secrets.update(_row(1)),
                     lambda: secrets.get("team-a", "s1"), lambda: secrets.delete("sec_1"),
                     lambda: secrets.list("team-a", after=None, limit=10),
                     lambda: secrets.count("team-a"), lambda: audit.append([_entry(1)]),
                     lambda: audit.query(limit=10), lambda: audit.keep_newest(10)):
            await _refused(call)
        # The trail drops what it cannot write (logged) and a read says why it cannot answer.
        trail = AuditTrail(audit, keep=100)
        trail.record(_entry(1))
        await trail.flush()
        assert trail._pending == []
        await _refused(lambda: trail.query(limit=10))
        vault = Vault(secrets, OPERATOR_KEY)
        await _refused(lambda: vault.create("team-a", "k", "v"))
        await _refused(lambda: vault.reveal("team-a", "k"))
    finally:
        await secrets.close()
        await audit.close()
