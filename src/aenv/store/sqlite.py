"""The node store on SQLite in WAL mode.

Every state change is a compare-and-set on the row's ``version``: callers read a record, decide,
and write back only if nobody changed it in between (``Conflict`` otherwise). A change is durable
once the call returns: WAL with ``synchronous=NORMAL`` survives a crash of the server process (the
OS still has the pages); ``durable=True`` in settings switches to FULL for power-loss safety.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from aenv.core.errors import Conflict, NotFound
from aenv.core.states import SandboxState, allowed
from aenv.store.migrations import MIGRATIONS
from aenv.store.models import COLUMNS, SandboxRecord, from_row, to_row
from aenv.store.transactions import transaction


class Store:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        # Write-through cache of rows by id: this process is the database's only writer, so
        # the proxy's per-request lookup needs no round trip to SQLite's thread.
        self._cache: dict[str, SandboxRecord] = {}
        #: Bumped by every write to a sandbox's row or cached copy: a read that awaited the
        #: database across a write must not put its older row into the cache (it did: a
        #: resume's ``running`` was shadowed by a concurrent read's ``resuming``, and the
        #: sandbox was settled from the stale copy).
        self._writes = 0
        #: Told of every lifecycle event as it is recorded (``orchestrator/sandbox_logs.py``):
        #: (sandbox id, its team or None, kind, detail, the record as written or deleted, if
        #: known). Called in line: it must not block or raise.
        self.on_event: Callable[[str, str | None, str, Any, SandboxRecord | None], None] \
            | None = None

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "NORMAL") -> Store:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(path, isolation_level=None)
        db.row_factory = aiosqlite.Row
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute(f"PRAGMA synchronous={synchronous}")
        await db.execute("PRAGMA busy_timeout=5000")
        store = cls(db)
        await store._migrate()
        return store

    @property
    def db(self) -> aiosqlite.Connection:
        """The connection, for the other record kinds kept in the same database
        (``store/templates.py``)."""
        return self._db

    async def close(self) -> None:
        await self._db.close()

    async def _migrate(self) -> None:
        await self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)")
        async with self._db.execute("SELECT MAX(version) FROM schema_version") as cur:
            row = await cur.fetchone()
        current = (row[0] if row else None) or 0
        for number, script in enumerate(MIGRATIONS, start=1):
            if number <= current:
                continue
            async with transaction(self._db):
                for statement in filter(None, (s.strip() for s in script.split(";"))):
                    await self._db.execute(statement)
                await self._db.execute("INSERT INTO schema_version VALUES (?)", (number,))

    # -- sandboxes ---------------------------------------------------------------------------

    async def insert(self, record: SandboxRecord) -> None:
        row = to_row(record)
        names = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        await self._db.execute(f"INSERT INTO sandboxes ({names}) VALUES ({marks})", row)
        self._writes += 1
        self._cache[record.sandbox_id] = record

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        cached = self._cache.get(sandbox_id)
        if cached is not None:
            return cached
        writes = self._writes
        async with self._db.execute(
            "SELECT * FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        record = from_row(dict(row))
        if self._writes == writes:
            self._cache[sandbox_id] = record
        else:
            # Written meanwhile: the cache (if it holds it) has the newer copy.
            record = self._cache.get(sandbox_id, record)
        return record

    async def require(self, sandbox_id: str) -> SandboxRecord:
        record = await self.get(sandbox_id)
        if record is None:
            raise NotFound(f"sandbox {sandbox_id} not found{await self._died(sandbox_id)}")
        return record

    async def require_visible(self, sandbox_id: str) -> SandboxRecord:
        """As :meth:`require`, and a record being killed is ``NotFound`` too: the sandbox is
        gone for clients from its kill's answer on, while its release still runs."""
        record = await self.require(sandbox_id)
        if record.state == SandboxState.KILLING:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return record

    async def _died(self, sandbox_id: str) -> str:
        """Why a sandbox that is gone died (``orchestrator/deaths.py``), for its 404s."""
        async with self._db.execute(
            "SELECT at, detail FROM events WHERE sandbox_id = ? AND kind = 'died' "
            "ORDER BY id DESC LIMIT 1", (sandbox_id,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return ""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row["at"]))
        detail = json.loads(row["detail"]) if row["detail"] else {}
        return f": it died at {when}: {detail.get('message', 'its runtime exited')}"

    async def list(
        self, states: Iterable[SandboxState] | None = None
    ) -> builtins.list[SandboxRecord]:
        query = "SELECT * FROM sandboxes"
        args: list[Any] = []
        wanted = list(states) if states is not None else None
        if wanted is not None:
            query += f" WHERE state IN ({', '.join('?' for _ in wanted)})"
            args = [str(s) for s in wanted]
        query += " ORDER BY started_at DESC, sandbox_id DESC"
        async with self._db.execute(query, args) as cur:
            rows = await cur.fetchall()
        return [from_row(dict(r)) for r in rows]

    async def expired(self, now: float) -> builtins.list[SandboxRecord]:
        async with self._db.execute(
            "SELECT * FROM sandboxes WHERE state = ? AND end_at <= ?",
            (str(SandboxState.RUNNING), now),
        ) as cur:
            rows = await cur.fetchall()
        return [from_row(dict(r)) for r in rows]

    async def count(self, states: Sequence[SandboxState]) -> int:
        marks = ", ".join("?" for _ in states)
        async with self._db.execute(
            f"SELECT COUNT(*) FROM sandboxes WHERE state IN ({marks})", [str(s) for s in states]
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def update(self, record: SandboxRecord, **changes: Any) -> SandboxRecord:
        """Write ``changes`` if the row is still at ``record.version`` (else ``Conflict``).

        Only the changed columns are written, onto the row as it is now: a field written
        without a version change meanwhile (``set_end_at``) is kept, not overwritten from a
        caller's older copy."""
        current = self._cache.get(record.sandbox_id)
        base = current if current is not None and current.version == record.version else record
        new = base.evolve(version=record.version + 1, **changes)
        columns = set(changes) | {"version"}
        if new.state != record.state:
            if not allowed(record.state, new.state):
                raise Conflict(
                    f"sandbox {record.sandbox_id} cannot go from {record.state} to {new.state}"
                )
            new = new.evolve(state_changed_at=time.time())
            columns.add("state_changed_at")
        row = to_row(new)
        sets = ", ".join(f"{k} = :{k}" for k in COLUMNS if k in columns and k != "sandbox_id")
        cur = await self._db.execute(
            f"UPDATE sandboxes SET {sets} WHERE sandbox_id = :sandbox_id AND version = :old",
            {**{k: row[k] for k in columns | {"sandbox_id"}}, "old": record.version},
        )
        if cur.rowcount != 1:
            self._writes += 1
            self._cache.pop(record.sandbox_id, None)
            raise Conflict(f"sandbox {record.sandbox_id} changed concurrently; retry")
        latest = self._cache.get(record.sandbox_id)
        if latest is not None and latest.version == record.version and latest is not base:
            # A field written during the write above (``set_end_at``) is in the row: keep it.
            new = latest.evolve(**{k: getattr(new, k) for k in columns})
        self._writes += 1
        self._cache[new.sandbox_id] = new
        if new.state != record.state:
            await self.add_event(new.sandbox_id, f"state:{new.state}",
                                 {"from": str(record.state),
                                  **({"reason": new.last_error}
                                     if new.state == SandboxState.KILLING and new.last_error
                                     else {})},
                                 team_id=new.team_id, record=new)
        return new

    async def annotate(self, record: SandboxRecord, **keys: Any) -> SandboxRecord:
        """Add ``keys`` to the sandbox's ``instance`` if the row is still at
        ``record.version``, without changing the version (else ``Conflict``).

        For a note written beside the operation that holds the sandbox (the repository
        publish's ``published``, written outside the turn): that operation read the same
        version, and its next write must not fail on the note. A write that moved the row
        on first (a resume, a kill) makes the note fail, which is what its writer wants to
        know."""
        current = self._cache.get(record.sandbox_id)
        base = current if current is not None and current.version == record.version else record
        instance = {**(base.instance or {}), **keys}
        cur = await self._db.execute(
            "UPDATE sandboxes SET instance = ? WHERE sandbox_id = ? AND version = ?",
            (json.dumps(instance, sort_keys=True), record.sandbox_id, record.version),
        )
        self._writes += 1
        if cur.rowcount != 1:
            self._cache.pop(record.sandbox_id, None)
            raise Conflict(f"sandbox {record.sandbox_id} changed concurrently; retry")
        latest = self._cache.get(record.sandbox_id)
        if latest is not None and latest.version == record.version:
            base = latest  # keeps a field written meanwhile (``set_end_at``)
        new = base.evolve(instance={**(base.instance or {}), **keys})
        self._cache[new.sandbox_id] = new
        return new

    async def set_end_at(self, sandbox_id: str, end_at: float) -> SandboxRecord:
        """Set the sandbox's end time whatever operation holds it (the version is not
        changed, so the operation's next write does not conflict with it); ``NotFound`` when
        it is gone or being killed."""
        record = await self.require(sandbox_id)
        if record.state == SandboxState.KILLING:
            raise NotFound(f"sandbox {sandbox_id} not found")
        cur = await self._db.execute(
            "UPDATE sandboxes SET end_at = ? WHERE sandbox_id = ? AND state != ?",
            (end_at, sandbox_id, str(SandboxState.KILLING)),
        )
        if cur.rowcount != 1:
            self._writes += 1
            self._cache.pop(sandbox_id, None)
            raise NotFound(f"sandbox {sandbox_id} not found")
        current = self._cache.get(sandbox_id)
        if current is None:
            return record.evolve(end_at=end_at)
        self._writes += 1
        self._cache[sandbox_id] = current = current.evolve(end_at=end_at)
        return current

    async def delete(self, record: SandboxRecord) -> None:
        cur = await self._db.execute(
            "DELETE FROM sandboxes WHERE sandbox_id = ? AND version = ?",
            (record.sandbox_id, record.version),
        )
        self._writes += 1
        self._cache.pop(record.sandbox_id, None)
        if cur.rowcount != 1:
            raise Conflict(f"sandbox {record.sandbox_id} changed concurrently; retry")
        await self.add_event(record.sandbox_id, "deleted", None, team_id=record.team_id,
                             record=record)

    # -- events ------------------------------------------------------------------------------

    async def add_event(self, sandbox_id: str, kind: str, detail: Any, *,
                        team_id: str | None = None,
                        record: SandboxRecord | None = None) -> None:
        await self._db.execute(
            "INSERT INTO events (sandbox_id, at, kind, detail) VALUES (?, ?, ?, ?)",
            (sandbox_id, time.time(), kind, None if detail is None else json.dumps(detail)),
        )
        if self.on_event is not None:
            self.on_event(sandbox_id, team_id, kind, detail, record)

    async def events(self, sandbox_id: str) -> builtins.list[dict[str, Any]]:
        async with self._db.execute(
            "SELECT at, kind, detail FROM events WHERE sandbox_id = ? ORDER BY id", (sandbox_id,)
        ) as cur:
            rows = await cur.fetchall()
        return [
            {"at": r["at"], "kind": r["kind"],
             "detail": json.loads(r["detail"]) if r["detail"] else None}
            for r in rows
        ]
