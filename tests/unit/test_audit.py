"""The audit log below the API: rows appended in batches, read newest first with filters and
pages, bounded; the trail's pending entries written before any read; and how a request's
scope becomes who, what and which object."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from aenv.api.audit import action_of, actor_of, created_object
from aenv.orchestrator.audit import MAX_PENDING, AuditTrail
from aenv.store.audit import AuditStore
from aenv.store.models import AuditEntry
from aenv.store.sqlite import Store

pytestmark = pytest.mark.anyio


def _entry(n: int, *, actor: str = "key:aaaaaaaaaaaa", object_id: str | None = "sbx1",
           status: int = 204) -> AuditEntry:
    return AuditEntry(at=1_000.0 + n, actor=actor, action=f"POST /sandboxes/{{sandbox_id}}/{n}",
                      object_id=object_id, client="10.0.0.1", status=status)


async def test_rows_newest_first_filtered_paged_and_bounded(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    try:
        audit = AuditStore(store.db)
        await audit.append([_entry(n) for n in range(5)])
        await audit.append([_entry(5, actor="anonymous", object_id=None, status=401),
                            _entry(6, object_id="sbx2", status=404)])
        newest = await audit.query(limit=3)
        assert [e.seq for e in newest] == [7, 6, 5]
        assert (newest[1].actor, newest[1].object_id, newest[1].status) == ("anonymous", None,
                                                                            401)
        assert [e.seq for e in await audit.query(limit=3, before=5)] == [4, 3, 2]
        assert [e.seq for e in await audit.query(limit=10, object_id="sbx2")] == [7]
        assert [e.seq for e in await audit.query(limit=10, actor="anonymous")] == [6]
        assert await audit.keep_newest(4) == 3
        assert [e.seq for e in await audit.query(limit=10)] == [7, 6, 5, 4]
    finally:
        await store.close()
    # Durable: the same rows after a reopen.
    store = await Store.open(tmp_path / "state.db")
    try:
        assert len(await AuditStore(store.db).query(limit=10)) == 4
    finally:
        await store.close()


async def test_the_trail_writes_what_is_pending_before_a_read_and_bounds_it(
        tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "state.db")
    try:
        trail = AuditTrail(AuditStore(store.db), keep=100)
        for n in range(120):
            trail.record(_entry(n))
        got = await trail.query(limit=1000)
        assert len(got) == 100 and got[0].action.endswith("/119")
        # A stalled writer does not grow without bound: entries past the cap are dropped.
        for n in range(MAX_PENDING + 5):
            trail.record(_entry(n))
        assert len(trail._pending) == MAX_PENDING
        await trail.flush()
        assert trail._pending == []
    finally:
        await store.close()


def test_who_what_and_which_object_from_a_request() -> None:
    route = SimpleNamespace(path="/sandboxes/{sandbox_id}/pause")
    scope = {"method": "POST", "path": "/sandboxes/abc/pause", "route": route,
             "path_params": {"sandbox_id": "abc"}}
    assert action_of(scope) == ("POST /sandboxes/{sandbox_id}/pause", "abc")
    # No route matched: the path as sent (cut short), no object.
    unmatched = {"method": "DELETE", "path": "/nowhere/" + "x" * 500}
    action, object_id = action_of(unmatched)
    assert action.startswith("DELETE /nowhere/") and len(action) <= 7 + 200
    assert object_id is None
    # The key is never written, only a hash prefix of it.
    assert actor_of(None) == actor_of("") == "anonymous"
    who = actor_of("e2b_secret_key_value")
    assert who.startswith("key:") and len(who) == 16 and "secret" not in who
    assert actor_of("e2b_secret_key_value") == who != actor_of("another")


def test_a_create_names_its_object_in_its_answer() -> None:
    assert created_object(b'{"sandboxID": "s1", "templateID": "base"}') == "s1"
    assert created_object(b'{"volumeID": "v1", "name": "data"}') == "v1"
    assert created_object(b'[{"sandboxID": "s1"}]') is None  # a fork's children: several
    assert created_object(b'{"sandboxID": 5}') is None
    assert created_object(b'{"sandboxID": "s1", "tru') is None  # cut short
