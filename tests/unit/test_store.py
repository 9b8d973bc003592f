"""The SQLite store: migrations, compare-and-set transitions, durability across reopen."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from aenv.core.errors import Conflict
from aenv.core.ids import new_sandbox_id
from aenv.core.states import TRANSITIONS, SandboxState
from aenv.store.models import SandboxRecord
from aenv.store.sqlite import Store

pytestmark = pytest.mark.anyio


def _record(**changes: object) -> SandboxRecord:
    now = time.time()
    base = SandboxRecord(
        sandbox_id=new_sandbox_id(), template_id="base", state=SandboxState.CREATING, version=1,
        created_at=now, started_at=now, end_at=now + 300, cpu_count=2, memory_mb=512,
        disk_size_mb=1024, envd_token="t", client_id="c", metadata={"k": "v"},
        env_vars={"A": "1"}, instance={"runtime_id": "x"},
    )
    return base.evolve(**changes)


async def test_insert_get_roundtrip(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    record = _record(allow_internet_access=False, network={"allowOut": ["1.1.1.1"]})
    await store.insert(record)
    assert await store.get(record.sandbox_id) == record
    await store.close()


async def test_compare_and_set(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    record = _record()
    await store.insert(record)
    running = await store.update(record, state=SandboxState.RUNNING)
    assert running.version == 2 and running.state == SandboxState.RUNNING
    with pytest.raises(Conflict):  # stale version
        await store.update(record, state=SandboxState.RUNNING)
    with pytest.raises(Conflict):  # not an edge of the lifecycle
        await store.update(running, state=SandboxState.RESUMING)
    events = await store.events(record.sandbox_id)
    assert events[-1]["kind"] == "state:running"
    await store.close()


async def test_a_note_beside_an_operation_does_not_make_it_conflict(tmp_path: Path) -> None:
    """The repository publish notes ``published`` outside the sandbox's turn; the operation
    holding the turn read the same version and must still write (CI: a connect answered 409
    "changed concurrently" when the publish finished between its read and its write). A
    note after the operation wrote fails instead, so the publish learns it is stale."""
    store = await Store.open(tmp_path / "state.db")
    created = _record()
    await store.insert(created)
    record = await store.update(created, state=SandboxState.RUNNING)
    paused = await store.update(await store.update(record, state=SandboxState.PAUSING),
                                state=SandboxState.PAUSED)
    held = await store.require(paused.sandbox_id)  # what the resume read in its turn
    noted = await store.annotate(paused, published=True)
    assert noted.version == paused.version and noted.instance == {"runtime_id": "x",
                                                                  "published": True}
    reopened = await Store.open(tmp_path / "state.db")
    assert (await reopened.require(paused.sandbox_id)).instance == noted.instance
    await reopened.close()
    resuming = await store.update(held, state=SandboxState.RESUMING)
    assert resuming.version == paused.version + 1
    with pytest.raises(Conflict):
        await store.annotate(paused, published=True)
    await store.close()


async def test_reopen_keeps_everything_and_migrations_are_idempotent(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    records = [_record(started_at=float(i)) for i in range(5)]
    for r in records:
        await store.insert(r)
    await store.close()
    again = await Store.open(tmp_path / "state.db")
    listed = await again.list()
    assert [r.sandbox_id for r in listed] == [r.sandbox_id for r in reversed(records)]
    await again.close()


async def test_expired_and_count(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    old = _record(state=SandboxState.RUNNING, end_at=time.time() - 1)
    fresh = _record(state=SandboxState.RUNNING)
    await store.insert(old)
    await store.insert(fresh)
    assert [r.sandbox_id for r in await store.expired(time.time())] == [old.sandbox_id]
    assert await store.count([SandboxState.RUNNING]) == 2
    await store.delete(old)
    assert await store.get(old.sandbox_id) is None
    await store.close()


def test_every_state_is_reachable_and_public_state_is_e2b_shaped() -> None:
    reachable = {dst for (_, dst) in TRANSITIONS} | {SandboxState.CREATING}
    assert reachable == set(SandboxState)
    assert {s.public for s in SandboxState} == {"running", "paused"}


class _SlowReads:
    """The store's connection, with every SELECT of one row held until ``release``."""

    def __init__(self, db: object) -> None:
        self._db = db
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    def execute(self, sql: str, *args: object) -> object:
        inner = self._db.execute(sql, *args)  # type: ignore[attr-defined]
        if not sql.startswith("SELECT * FROM sandboxes WHERE sandbox_id"):
            return inner
        outer = self

        class Held:
            async def __aenter__(self) -> object:
                cursor = await inner.__aenter__()
                row = await cursor.fetchone()
                outer.reading.set()
                await outer.release.wait()  # a write lands while this read is in flight

                class Done:
                    async def fetchone(self) -> object:
                        return row

                self._cursor = cursor
                return Done()

            async def __aexit__(self, *exc: object) -> None:
                await inner.__aexit__(*exc)

        return Held()

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)


async def test_a_read_across_a_write_does_not_cache_its_older_row(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    record = _record()
    await store.insert(record)
    store._cache.clear()  # the next get reads the database
    slow = _SlowReads(store._db)
    real = store._db
    store._db = slow  # type: ignore[assignment]
    read = asyncio.create_task(store.get(record.sandbox_id))
    await slow.reading.wait()
    store._db = real
    written = await store.update(record, state=SandboxState.RUNNING)
    slow.release.set()
    stale = await read
    assert stale is not None and stale.version <= written.version
    # What every later reader sees is the write, not the row read before it.
    assert await store.get(record.sandbox_id) == written
    await store.close()
