"""The cluster's teams and keys in Redis (``orchestrator/team_directory.py``'s protocol):
every node and gateway reads the same directory, on every lookup, so a key revoked through
one is refused by all at the next call (docs/teams.md, "Cluster").

Layout (``keys.py``): ``teams`` and ``credentials`` hashes of JSON rows (credentials by the
SHA-256 of their value), ``team-names`` for unique names, ``team-default`` for the default
team's id, ``credentials-used`` for last uses. Creating a team and creating the default team
are Lua scripts, so two nodes or gateways racing cannot make two teams of one name or two
default teams.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import asdict, replace
from typing import Any

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import reachable
from aenv.core.errors import Conflict
from aenv.store.models import CredentialRow, TeamRow

# KEYS: teams, team-names, team-default; ARGV: id, name, row JSON.
_ENSURE_DEFAULT = """
local existing = redis.call('GET', KEYS[3])
if existing then return existing end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[1])
return ARGV[1]
"""
# KEYS: teams, team-names; ARGV: id, name, row JSON. 0: the name is taken.
_ADD_TEAM = """
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


_reachable = reachable("the cluster's team directory")


def _team(raw: str | bytes) -> TeamRow:
    return TeamRow(**json.loads(raw))


def _credential(raw: str | bytes) -> CredentialRow:
    return CredentialRow(**json.loads(raw))


class RedisDirectory:
    def __init__(self, redis: Redis, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys or Keys()

    @_reachable
    async def start(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()

    @_reachable
    async def teams(self) -> builtins.list[TeamRow]:
        rows = await self.redis.hvals(self.keys.teams)
        return sorted((_team(r) for r in rows), key=lambda t: t.created_at)

    @_reachable
    async def team(self, team_id: str) -> TeamRow | None:
        raw = await self.redis.hget(self.keys.teams, team_id)
        return _team(raw) if raw else None

    @_reachable
    async def default_team_id(self) -> str | None:
        found = await self.redis.get(self.keys.default_team)
        return str(found) if found else None

    @_reachable
    async def ensure_default(self, candidate: TeamRow) -> TeamRow:
        script = self.redis.register_script(_ENSURE_DEFAULT)
        team_id = await script(keys=[self.keys.teams, self.keys.team_names,
                                     self.keys.default_team],
                               args=[candidate.team_id, candidate.name,
                                     json.dumps(asdict(candidate))])
        team = await self.team(str(team_id))
        if team is None:
            raise Conflict(f"the cluster's default team {team_id} has no record")
        return team

    @_reachable
    async def add_team(self, team: TeamRow) -> None:
        script = self.redis.register_script(_ADD_TEAM)
        added = await script(keys=[self.keys.teams, self.keys.team_names],
                             args=[team.team_id, team.name, json.dumps(asdict(team))])
        if not int(added):
            raise Conflict(f"a team named '{team.name}' exists")

    @_reachable
    async def set_quota(self, team_id: str, quota: dict[str, Any] | None) -> None:
        team = await self.team(team_id)
        if team is not None:
            await self.redis.hset(self.keys.teams, team_id,
                                  json.dumps(asdict(replace(team, quota=quota))))

    @_reachable
    async def remove_team(self, team_id: str) -> None:
        team = await self.team(team_id)
        gone = [c for c in await self._all() if c.team_id == team_id]
        async with self.redis.pipeline(transaction=True) as pipe:
            # The keys first: none of them is let in after this.
            if gone:
                pipe.hdel(self.keys.credentials, *(c.digest for c in gone))
                pipe.hdel(self.keys.credentials_used, *(c.key_id for c in gone))
            pipe.hdel(self.keys.teams, team_id)
            if team is not None:
                pipe.hdel(self.keys.team_names, team.name)
            await pipe.execute()

    @_reachable
    async def credential(self, digest: str) -> CredentialRow | None:
        raw = await self.redis.hget(self.keys.credentials, digest)
        return _credential(raw) if raw else None

    @_reachable
    async def credentials(self, team_id: str) -> builtins.list[CredentialRow]:
        rows = [c for c in await self._all() if c.team_id == team_id]
        if rows:
            used = await self.redis.hmget(
                self.keys.credentials_used, [c.key_id for c in rows])
            rows = [replace(c, last_used=float(u)) if u else c for c, u in zip(rows, used,
                                                                               strict=True)]
        return sorted(rows, key=lambda c: c.created_at)

    @_reachable
    async def add_credential(self, row: CredentialRow) -> None:
        await self.redis.hset(self.keys.credentials, row.digest,
                              json.dumps(asdict(replace(row, last_used=None))))

    @_reachable
    async def rename_credential(self, row: CredentialRow, name: str) -> None:
        current = await self.credential(row.digest)
        if current is not None:
            await self.add_credential(replace(current, name=name))

    @_reachable
    async def remove_credential(self, row: CredentialRow) -> None:
        await self.redis.hdel(self.keys.credentials, row.digest)
        await self.redis.hdel(self.keys.credentials_used, row.key_id)

    @_reachable
    async def record_use(self, used: dict[str, float]) -> None:
        if used:
            await self.redis.hset(self.keys.credentials_used,
                                  mapping={k: repr(v) for k, v in used.items()})

    @_reachable
    async def _all(self) -> builtins.list[CredentialRow]:
        return [_credential(r) for r in
                await self.redis.hvals(self.keys.credentials)]
