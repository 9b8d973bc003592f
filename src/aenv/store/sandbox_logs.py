"""A sandbox's log rows (``orchestrator/sandbox_logs.py`` decides what goes in): append in
batches, read a page by time in either direction with a minimum level and a substring, keep
the newest N per sandbox, drop those of sandboxes gone long enough, and remember how far each
sandbox's console was read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiosqlite

from aenv.store.transactions import transaction

#: E2B's ``LogLevel``s, lowest first.
LEVELS = ("debug", "info", "warn", "error")


@dataclass(frozen=True)
class LogRow:
    sandbox_id: str
    at: float
    level: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)
    team_id: str | None = None


class SandboxLogStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def append(self, rows: Sequence[LogRow]) -> None:
        """Write ``rows`` in one transaction."""
        if not rows:
            return
        async with transaction(self._db):
            await self._db.executemany(
                "INSERT INTO sandbox_logs (sandbox_id, team_id, at, level, message, fields) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.sandbox_id, r.team_id, r.at, r.level, r.message,
                  json.dumps(r.fields) if r.fields else None) for r in rows])

    async def page(self, sandbox_id: str, *, since: float | None, limit: int,
                   forward: bool = True, level: str | None = None,
                   search: str | None = None) -> list[LogRow]:
        """At most ``limit`` rows of the sandbox in time order (``forward``) from ``since``
        on, or newest first up to ``since`` (backward); at ``level`` or above; whose
        message holds ``search`` (case-sensitive)."""
        where, args = ["sandbox_id = ?"], [sandbox_id]
        if since is not None:
            where.append("at >= ?" if forward else "at <= ?")
            args.append(since)  # type: ignore[arg-type]
        if level is not None and level in LEVELS:
            wanted = LEVELS[LEVELS.index(level):]
            where.append(f"level IN ({', '.join('?' * len(wanted))})")
            args += wanted
        if search:
            where.append("instr(message, ?) > 0")
            args.append(search)
        order = "ASC" if forward else "DESC"
        sql = (f"SELECT sandbox_id, at, level, message, fields, team_id FROM sandbox_logs "
               f"WHERE {' AND '.join(where)} ORDER BY at {order}, id {order} LIMIT ?")
        async with self._db.execute(sql, (*args, limit)) as cur:
            found = await cur.fetchall()
        return [LogRow(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else {}, r[5])
                for r in found]

    async def team_of(self, sandbox_id: str) -> tuple[bool, str | None]:
        """Whether the sandbox has rows, and the team they name (None: the default)."""
        async with self._db.execute(
            "SELECT team_id FROM sandbox_logs WHERE sandbox_id = ? "
            "ORDER BY team_id IS NULL, id LIMIT 1", (sandbox_id,)) as cur:
            row = await cur.fetchone()
        return (row is not None, row[0] if row is not None else None)

    async def keep_newest(self, sandbox_id: str, count: int) -> int:
        """Drop all but the sandbox's newest ``count`` rows; how many went."""
        cur = await self._db.execute(
            "DELETE FROM sandbox_logs WHERE sandbox_id = ? AND id <= ("
            "SELECT id FROM sandbox_logs WHERE sandbox_id = ? ORDER BY id DESC "
            "LIMIT 1 OFFSET ?)", (sandbox_id, sandbox_id, count))
        return cur.rowcount

    async def drop_gone(self, live: set[str], before: float) -> int:
        """Drop the rows of every sandbox not in ``live`` whose newest row is older than
        ``before`` (gone long enough), and their console offsets; how many rows went."""
        async with self._db.execute(
            "SELECT sandbox_id FROM sandbox_logs GROUP BY sandbox_id HAVING MAX(at) < ?",
            (before,)) as cur:
            old = [r[0] for r in await cur.fetchall() if r[0] not in live]
        dropped = 0
        for sandbox_id in old:
            cur = await self._db.execute("DELETE FROM sandbox_logs WHERE sandbox_id = ?",
                                         (sandbox_id,))
            dropped += cur.rowcount
            await self._db.execute("DELETE FROM sandbox_log_offsets WHERE sandbox_id = ?",
                                   (sandbox_id,))
        return dropped

    async def offset(self, sandbox_id: str) -> int:
        """How far the sandbox's console was read, in bytes (0: not yet)."""
        async with self._db.execute(
            "SELECT console_offset FROM sandbox_log_offsets WHERE sandbox_id = ?",
            (sandbox_id,)) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def set_offset(self, sandbox_id: str, offset: int) -> None:
        await self._db.execute(
            "INSERT INTO sandbox_log_offsets (sandbox_id, console_offset) VALUES (?, ?) "
            "ON CONFLICT (sandbox_id) DO UPDATE SET console_offset = excluded.console_offset",
            (sandbox_id, offset))
