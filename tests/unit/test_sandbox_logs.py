"""Sandbox logs on a real SQLite store (``orchestrator/sandbox_logs.py``,
``store/sandbox_logs.py``): a console read in pieces (a line split across reads, a line too
long, a console started again by a restore), where it was read to surviving a restart, the
newest entries kept, a gone sandbox's logs dropped after their time, and what each store
event says."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.orchestrator import sandbox_logs
from aenv.orchestrator.sandbox_logs import MAX_LINE, LogBook, console_level, render
from aenv.store.sandbox_logs import LogRow, SandboxLogStore
from aenv.store.sqlite import Store

pytestmark = pytest.mark.anyio


async def _book(tmp_path: Path, console: Path, **options: object) -> tuple[Store, LogBook]:
    store = await Store.open(tmp_path / "state.db")
    book = LogBook(store, SandboxLogStore(store.db), lambda _: console, **options)  # type: ignore[arg-type]
    store.on_event = book.on_event
    return store, book


async def _messages(book: LogBook, sandbox_id: str = "s1") -> list[str]:
    await book.flush()
    return [r.message for r in await book.rows.page(sandbox_id, since=None, limit=1000)]


async def test_a_console_is_read_in_pieces_and_from_where_it_stopped(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_bytes(b"envd started\nhalf a li")
    store, book = await _book(tmp_path, console)
    await book.collect("s1", "team-a")
    assert await _messages(book) == ["envd started"]
    with console.open("ab") as f:
        f.write(b"ne\n\nWARNING: slow\n" + b"x" * (MAX_LINE + 10) + b"\n")
    await book.collect("s1", "team-a")
    await book.flush()
    rows = await book.rows.page("s1", since=None, limit=10)
    assert [r.message for r in rows][:3] == ["envd started", "half a line", "WARNING: slow"]
    assert rows[2].level == "warn" and rows[2].fields == {"source": "console"}
    assert rows[3].message.endswith("…") and len(rows[3].message) == MAX_LINE + 1
    assert await book.rows.team_of("s1") == (True, "team-a")
    await store.close()
    # A restarted node reads on from where this one stopped: nothing twice.
    with console.open("ab") as f:
        f.write(b"after the restart\n")
    store, book = await _book(tmp_path, console)
    await book.collect("s1", "team-a")
    assert (await _messages(book))[-2:] == [rows[3].message, "after the restart"]
    # A restore starts a new console: read from its start.
    console.write_bytes(b"restored\n")
    await book.collect("s1", "team-a")
    assert (await _messages(book))[-1] == "restored"
    await store.close()


async def test_a_flooded_console_costs_a_bounded_read_each_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_logs, "CONSOLE_READ_BYTES", 64)
    console = tmp_path / "console.log"
    console.write_bytes(b"".join(b"line %03d\n" % i for i in range(100)))
    store, book = await _book(tmp_path, console)
    await book.collect("s1", None)
    assert len(await _messages(book)) == 7  # 64 bytes: seven whole lines of nine
    for _ in range(20):
        await book.collect("s1", None)
    assert await _messages(book) == [f"line {i:03d}" for i in range(100)]
    await store.close()


async def test_the_newest_are_kept_and_gone_logs_are_dropped(tmp_path: Path) -> None:
    store, book = await _book(tmp_path, tmp_path / "none")
    rows = book.rows
    await rows.append([LogRow("s1", float(i), "info", f"m{i}") for i in range(50)])
    await rows.append([LogRow("s2", 10.0, "info", "old"), LogRow("s3", 500.0, "info", "new")])
    assert await rows.keep_newest("s1", 20) == 30
    assert [r.message for r in await rows.page("s1", since=None, limit=100)] == \
        [f"m{i}" for i in range(30, 50)]
    await rows.set_offset("s2", 99)
    # s1 is live; s2's newest is older than the bound; s3's is not.
    assert await rows.drop_gone({"s1"}, before=100.0) == 1
    assert await rows.team_of("s2") == (False, None)
    assert await rows.offset("s2") == 0
    assert (await rows.team_of("s3"))[0]
    # Pages: backward from a time, a minimum level, a substring.
    await rows.append([LogRow("s4", 1.0, "debug", "a"), LogRow("s4", 2.0, "error", "b c"),
                       LogRow("s4", 3.0, "warn", "c")])
    back = await rows.page("s4", since=2.5, limit=10, forward=False)
    assert [r.message for r in back] == ["b c", "a"]
    assert [r.message for r in await rows.page("s4", since=None, limit=10, level="warn")] \
        == ["b c", "c"]
    assert [r.message for r in await rows.page("s4", since=None, limit=10, search="c")] \
        == ["b c", "c"]
    await store.close()


def test_what_each_event_says() -> None:
    assert render("state:running", {"from": "creating"})[:2] == ("info", "sandbox created")  # type: ignore[index]
    assert render("state:running", {"from": "resuming"})[1] == "sandbox resumed"  # type: ignore[index]
    assert render("state:running", {"from": "forking"})[1] == "sandbox forked"  # type: ignore[index]
    assert render("state:paused", {"from": "pausing"})[1] == "sandbox paused"  # type: ignore[index]
    assert render("state:paused", {"from": "resuming"})[0] == "warn"  # type: ignore[index]
    assert render("state:pausing", {"from": "running"})[0] == "debug"  # type: ignore[index]
    ending = render("state:killing", {"from": "running", "reason": "timeout"})
    assert ending == ("warn", "sandbox ending: timeout",
                      {"event": "state:killing", "from": "running", "reason": "timeout"})
    died = render("died", {"cause": "oom", "message": "out of memory"})
    assert died is not None and died[:2] == ("error", "sandbox died: out of memory")
    assert render("killed", None)[1] == "sandbox killed"  # type: ignore[index]
    assert render("deleted", None) is None  # the release, after the kill said so
    assert render("something-else", None) is None
    assert console_level("Traceback (most recent call last):") == "error"
    assert console_level("WARNING: x") == "warn"
    assert console_level("hello") == "info"


async def test_batches_of_several_stores_on_one_connection_take_turns(tmp_path: Path) -> None:
    """The node's stores share one connection: their batches at once must not meet inside
    one transaction ("cannot start a transaction within a transaction")."""
    from aenv.store.audit import AuditStore
    from aenv.store.models import AuditEntry
    from aenv.store.team_samples import TeamSample, TeamSampleStore

    store, book = await _book(tmp_path, tmp_path / "none")
    audit, samples = AuditStore(store.db), TeamSampleStore(store.db)
    batches = []
    for i in range(20):
        batches += [
            book.rows.append([LogRow(f"s{i}", float(j), "info", f"m{j}") for j in range(20)]),
            audit.append([AuditEntry(at=float(i), actor="a", action="POST /x", object_id=None,
                                     client=None, status=200)]),
            samples.append([TeamSample("t", i * 5, 1, 1)]),
        ]
    await asyncio.gather(*batches)
    assert len(await book.rows.page("s19", since=None, limit=100)) == 20
    assert len(await audit.query(limit=100)) == 20
    await store.close()
