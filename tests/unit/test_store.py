"""The SQLite store: migrations, compare-and-set transitions, durability across reopen."""

from __future__ import annotations

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
