"""The audit log's rows (``orchestrator/audit.py`` decides what goes in): append in batches,
read newest first, keep the newest N."""

from __future__ import annotations

from collections.abc import Sequence

import aiosqlite

from aenv.store.models import AuditEntry
from aenv.store.transactions import transaction

_COLUMNS = "seq, at, actor, action, object_id, client, status, team_id, key_name"


class AuditStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def append(self, entries: Sequence[AuditEntry]) -> None:
        """Write ``entries`` in one transaction (in order: their seqs grow with it)."""
        if not entries:
            return
        async with transaction(self._db):
            await self._db.executemany(
                "INSERT INTO audit (at, actor, action, object_id, client, status, team_id, "
                "key_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.at, e.actor, e.action, e.object_id, e.client, e.status, e.team_id,
                  e.key_name) for e in entries])

    async def query(self, *, limit: int, before: int | None = None,
                    object_id: str | None = None, actor: str | None = None,
                    team_id: str | None = None) -> list[AuditEntry]:
        """Newest first: at most ``limit`` entries older than seq ``before``, of one object,
        one actor or one team if given."""
        where: list[str] = []
        args: list[object] = []
        if before is not None:
            where.append("seq < ?")
            args.append(before)
        if object_id is not None:
            where.append("object_id = ?")
            args.append(object_id)
        if actor is not None:
            where.append("actor = ?")
            args.append(actor)
        if team_id is not None:
            where.append("team_id = ?")
            args.append(team_id)
        sql = (f"SELECT {_COLUMNS} FROM audit"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + " ORDER BY seq DESC LIMIT ?")
        async with self._db.execute(sql, (*args, limit)) as cur:
            rows = await cur.fetchall()
        return [AuditEntry(seq=r[0], at=r[1], actor=r[2], action=r[3], object_id=r[4],
                           client=r[5], status=r[6], team_id=r[7], key_name=r[8])
                for r in rows]

    async def keep_newest(self, count: int) -> int:
        """Drop all but the newest ``count`` entries; how many went."""
        cur = await self._db.execute(
            "DELETE FROM audit WHERE seq <= (SELECT MAX(seq) FROM audit) - ?", (count,))
        return cur.rowcount
