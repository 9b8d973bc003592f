"""A team's secrets as rows (``orchestrator/secrets.py`` seals and opens their values)."""

from __future__ import annotations

import builtins
import json

import aiosqlite

from aenv.core.errors import AlreadyExists
from aenv.store.models import SecretRow

_COLUMNS = ("secret_id, team_id, name, current_version, metadata, created_at, updated_at, "
            "sealed")


def _row(r: aiosqlite.Row) -> SecretRow:
    return SecretRow(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], bytes(r[7]))


class SecretStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def insert(self, row: SecretRow) -> None:
        try:
            await self._db.execute(
                f"INSERT INTO secrets ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (row.secret_id, row.team_id, row.name, row.current_version,
                 json.dumps(row.metadata), row.created_at, row.updated_at, row.sealed))
        except aiosqlite.IntegrityError:
            raise AlreadyExists(f"a secret named '{row.name}' exists") from None

    async def update(self, row: SecretRow) -> None:
        await self._db.execute(
            "UPDATE secrets SET current_version = ?, metadata = ?, updated_at = ?, sealed = ? "
            "WHERE secret_id = ?",
            (row.current_version, json.dumps(row.metadata), row.updated_at, row.sealed,
             row.secret_id))

    async def get(self, team_id: str, id_or_name: str) -> SecretRow | None:
        async with self._db.execute(
                f"SELECT {_COLUMNS} FROM secrets WHERE team_id = ? AND "
                "(secret_id = ? OR name = ?)", (team_id, id_or_name, id_or_name.lower())) as cur:
            found = await cur.fetchone()
        return _row(found) if found else None

    async def list(self, team_id: str, *, after: str | None,
                   limit: int) -> builtins.list[SecretRow]:
        """Ordered by name; those after ``after``."""
        async with self._db.execute(
                f"SELECT {_COLUMNS} FROM secrets WHERE team_id = ? AND name > ? "
                "ORDER BY name LIMIT ?", (team_id, after or "", limit)) as cur:
            rows = await cur.fetchall()
        return [_row(r) for r in rows]

    async def delete(self, secret_id: str) -> None:
        await self._db.execute("DELETE FROM secrets WHERE secret_id = ?", (secret_id,))

    async def count(self, team_id: str) -> int:
        async with self._db.execute("SELECT COUNT(*) FROM secrets WHERE team_id = ?",
                                    (team_id,)) as cur:
            found = await cur.fetchone()
        return int(found[0]) if found else 0
