"""Teams, their credentials and what each owns, as rows (``orchestrator/tenancy.py`` decides
who may do what). A credential is stored as the SHA-256 of its value: the value itself is
shown once, when it is made, and never kept."""

from __future__ import annotations

import builtins
import json
from typing import Any

import aiosqlite

from aenv.store.models import CredentialRow, TeamRow
from aenv.store.transactions import transaction

_CREDENTIAL_COLUMNS = ("key_id, team_id, kind, name, digest, value_length, masked_prefix, "
                       "masked_suffix, created_at, last_used")


def _credential(row: aiosqlite.Row) -> CredentialRow:
    return CredentialRow(*row)


class TenancyStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    # -- teams -------------------------------------------------------------------------------

    async def insert_team(self, team: TeamRow) -> None:
        await self._db.execute(
            "INSERT INTO teams (team_id, name, is_default, created_at, quota) "
            "VALUES (?, ?, ?, ?, ?)",
            (team.team_id, team.name, int(team.is_default), team.created_at,
             None if team.quota is None else json.dumps(team.quota)))

    async def set_quota(self, team_id: str, quota: dict[str, Any] | None) -> None:
        await self._db.execute("UPDATE teams SET quota = ? WHERE team_id = ?",
                               (None if quota is None else json.dumps(quota), team_id))

    async def teams(self) -> builtins.list[TeamRow]:
        async with self._db.execute(
                "SELECT team_id, name, is_default, created_at, quota FROM teams "
                "ORDER BY created_at") as cur:
            rows = await cur.fetchall()
        return [TeamRow(r[0], r[1], bool(r[2]), r[3], json.loads(r[4]) if r[4] else None)
                for r in rows]

    async def delete_team(self, team_id: str) -> None:
        """The team and its credentials, in one transaction."""
        async with transaction(self._db):
            await self._db.execute("DELETE FROM credentials WHERE team_id = ?", (team_id,))
            await self._db.execute("DELETE FROM teams WHERE team_id = ?", (team_id,))

    # -- credentials -------------------------------------------------------------------------

    async def insert_credential(self, row: CredentialRow) -> None:
        await self._db.execute(
            f"INSERT INTO credentials ({_CREDENTIAL_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.key_id, row.team_id, row.kind, row.name, row.digest, row.value_length,
             row.masked_prefix, row.masked_suffix, row.created_at, row.last_used))

    async def credentials(self) -> builtins.list[CredentialRow]:
        async with self._db.execute(
                f"SELECT {_CREDENTIAL_COLUMNS} FROM credentials ORDER BY created_at") as cur:
            rows = await cur.fetchall()
        return [_credential(r) for r in rows]

    async def rename_credential(self, key_id: str, name: str) -> None:
        await self._db.execute("UPDATE credentials SET name = ? WHERE key_id = ?",
                               (name, key_id))

    async def delete_credential(self, key_id: str) -> None:
        await self._db.execute("DELETE FROM credentials WHERE key_id = ?", (key_id,))

    async def set_last_used(self, used: dict[str, float]) -> None:
        await self._db.executemany("UPDATE credentials SET last_used = ? WHERE key_id = ?",
                                   [(at, key_id) for key_id, at in used.items()])

    # -- ownership ---------------------------------------------------------------------------

    async def set_owner(self, kind: str, object_id: str, team_id: str) -> None:
        await self._db.execute(
            "INSERT OR REPLACE INTO owned (kind, object_id, team_id) VALUES (?, ?, ?)",
            (kind, object_id, team_id))

    async def drop_owner(self, kind: str, object_id: str) -> None:
        await self._db.execute("DELETE FROM owned WHERE kind = ? AND object_id = ?",
                               (kind, object_id))

    async def owners(self) -> builtins.list[tuple[str, str, str]]:
        """Every ``(kind, object_id, team_id)``."""
        async with self._db.execute("SELECT kind, object_id, team_id FROM owned") as cur:
            rows = await cur.fetchall()
        return [(r[0], r[1], r[2]) for r in rows]
