"""Where teams and their credentials live (``tenancy.py`` decides who may do what).

Two directories, chosen by the node's mode: :class:`LocalDirectory`, the node's own SQLite
database with everything held in memory (this process is its only writer, so the lookup on
every call is a dictionary read), and in cluster mode the cluster's Redis
(``cluster/team_directory.py``), read on every lookup so that a key revoked through any node
or gateway is refused by every other at once.

Every method may raise the directory's own errors (a database or Redis failure); ``add_team``
raises ``Conflict`` for a name in use, and ``ensure_default`` returns the default team that
exists already rather than adding a second one.
"""

from __future__ import annotations

import builtins
from dataclasses import replace
from typing import Any, Protocol

from aenv.core.errors import Conflict
from aenv.store.models import CredentialRow, TeamRow
from aenv.store.tenancy import TenancyStore


class TeamDirectory(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def teams(self) -> builtins.list[TeamRow]: ...
    async def team(self, team_id: str) -> TeamRow | None: ...
    async def ensure_default(self, candidate: TeamRow) -> TeamRow: ...
    async def add_team(self, team: TeamRow) -> None: ...
    async def set_quota(self, team_id: str, quota: dict[str, Any] | None) -> None: ...
    async def remove_team(self, team_id: str) -> None: ...
    async def credential(self, digest: str) -> CredentialRow | None: ...
    async def credentials(self, team_id: str) -> builtins.list[CredentialRow]: ...
    async def add_credential(self, row: CredentialRow) -> None: ...
    async def rename_credential(self, row: CredentialRow, name: str) -> None: ...
    async def remove_credential(self, row: CredentialRow) -> None: ...
    async def record_use(self, used: dict[str, float]) -> None: ...


class LocalDirectory:
    """The node's SQLite database, held in memory, written through."""

    def __init__(self, store: TenancyStore) -> None:
        self.store = store
        self._teams: dict[str, TeamRow] = {}
        self._credentials: dict[str, CredentialRow] = {}  # by digest

    async def start(self) -> None:
        self._teams = {t.team_id: t for t in await self.store.teams()}
        self._credentials = {c.digest: c for c in await self.store.credentials()}

    async def close(self) -> None:
        """Nothing: the database is the node store's."""

    async def teams(self) -> builtins.list[TeamRow]:
        return sorted(self._teams.values(), key=lambda t: t.created_at)

    async def team(self, team_id: str) -> TeamRow | None:
        return self._teams.get(team_id)

    async def ensure_default(self, candidate: TeamRow) -> TeamRow:
        existing = next((t for t in self._teams.values() if t.is_default), None)
        if existing is not None:
            return existing
        await self.add_team(candidate)
        return candidate

    async def add_team(self, team: TeamRow) -> None:
        # No await between the check and the insert into memory: two adds of one name
        # cannot both pass.
        if any(t.name == team.name for t in self._teams.values()):
            raise Conflict(f"a team named '{team.name}' exists")
        self._teams[team.team_id] = team
        try:
            await self.store.insert_team(team)
        except BaseException:
            self._teams.pop(team.team_id, None)
            raise

    async def set_quota(self, team_id: str, quota: dict[str, Any] | None) -> None:
        await self.store.set_quota(team_id, quota)
        if team_id in self._teams:
            self._teams[team_id] = replace(self._teams[team_id], quota=quota)

    async def remove_team(self, team_id: str) -> None:
        # Out of memory first: no call after this line is let in with its keys.
        self._teams.pop(team_id, None)
        for digest in [d for d, c in self._credentials.items() if c.team_id == team_id]:
            del self._credentials[digest]
        await self.store.delete_team(team_id)

    async def credential(self, digest: str) -> CredentialRow | None:
        return self._credentials.get(digest)

    async def credentials(self, team_id: str) -> builtins.list[CredentialRow]:
        return sorted((c for c in self._credentials.values() if c.team_id == team_id),
                      key=lambda c: c.created_at)

    async def add_credential(self, row: CredentialRow) -> None:
        await self.store.insert_credential(row)
        self._credentials[row.digest] = row

    async def rename_credential(self, row: CredentialRow, name: str) -> None:
        await self.store.rename_credential(row.key_id, name)
        if row.digest in self._credentials:
            self._credentials[row.digest] = replace(self._credentials[row.digest], name=name)

    async def remove_credential(self, row: CredentialRow) -> None:
        self._credentials.pop(row.digest, None)
        await self.store.delete_credential(row.key_id)

    async def record_use(self, used: dict[str, float]) -> None:
        await self.store.set_last_used(used)
        for digest, row in list(self._credentials.items()):
            if row.key_id in used:
                self._credentials[digest] = replace(row, last_used=used[row.key_id])
