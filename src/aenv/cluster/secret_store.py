"""The cluster's secrets in Redis (``orchestrator/secrets.py``'s :class:`SecretRows`): every
node reads and writes the same rows, so a secret set through any node or gateway is listed by
every node and put into the egress rules of a sandbox on any of them (docs/teams.md,
"Secrets").

Owns the secrets keys of ``keys.py`` and nothing else: ``secrets``, a hash of every team's
rows by secret id (as the node's ``secrets`` table is keyed); per team, ``secret-names``
(name → id: names are unique per team) and ``secret-order`` (the names in a sorted set whose
scores are all 0, so that ``ZRANGEBYLEX`` pages them in bytewise order, as SQLite's
``ORDER BY name`` does). Redis holds what ``Vault`` sealed and nothing in the clear: a row's
``sealed`` value is its ciphertext, base64-encoded in the row's JSON.

Create, update, delete, a read and a page of the list are each one Lua script, so two nodes
racing cannot make two secrets of one name, a delete never leaves a name that points nowhere
(or a row no name reaches), and a page never shows a half-made secret. Redis that cannot be
reached is ``Unavailable`` (503).
"""

from __future__ import annotations

import base64
import builtins
import json
from dataclasses import asdict, replace

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import reachable
from aenv.core.errors import AlreadyExists
from aenv.store.models import SecretRow

# KEYS: secrets, secret-names, secret-order; ARGV: id, name, row JSON. 0: the name is taken.
_INSERT = """
if redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[2])
return 1
"""
# KEYS: secrets; ARGV: id, row JSON. A secret deleted meanwhile stays deleted.
_UPDATE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
# KEYS: secrets, secret-names; ARGV: id or name, the name lower-cased, team id.
# The team's row with that id, else the team's row of that name.
_GET = """
local row = redis.call('HGET', KEYS[1], ARGV[1])
if row and cjson.decode(row)['team_id'] == ARGV[3] then return row end
local id = redis.call('HGET', KEYS[2], ARGV[2])
if id then return redis.call('HGET', KEYS[1], id) end
return false
"""
# KEYS: secrets, secret-names, secret-order; ARGV: id, its name. 0: it was gone.
_DELETE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then
  redis.call('HDEL', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
return 1
"""
# KEYS: secrets, secret-names, secret-order; ARGV: the lowest name ('-' or '(' .. after),
# limit. The rows, in name order.
_PAGE = """
local names = redis.call('ZRANGEBYLEX', KEYS[3], ARGV[1], '+', 'LIMIT', 0, tonumber(ARGV[2]))
local rows = {}
if #names == 0 then return rows end
local ids = redis.call('HMGET', KEYS[2], unpack(names))
for i = 1, #names do
  if ids[i] then
    local row = redis.call('HGET', KEYS[1], ids[i])
    if row then rows[#rows + 1] = row end
  end
end
return rows
"""


_reachable = reachable("the cluster's secrets")


def _dump(row: SecretRow) -> str:
    return json.dumps({**asdict(replace(row, sealed=b"")),
                       "sealed": base64.b64encode(row.sealed).decode()})


def _load(raw: str | bytes) -> SecretRow:
    fields = json.loads(raw)
    return SecretRow(**{**fields, "sealed": base64.b64decode(fields["sealed"])})


class RedisSecretStore:
    def __init__(self, redis: Redis, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self._insert = redis.register_script(_INSERT)
        self._update = redis.register_script(_UPDATE)
        self._get = redis.register_script(_GET)
        self._delete = redis.register_script(_DELETE)
        self._page = redis.register_script(_PAGE)

    async def close(self) -> None:
        await self.redis.aclose()

    def _team_keys(self, team_id: str) -> list[str]:
        return [self.keys.secrets, self.keys.secret_names(team_id),
                self.keys.secret_order(team_id)]

    @_reachable
    async def insert(self, row: SecretRow) -> None:
        added = await self._insert(keys=self._team_keys(row.team_id),
                                   args=[row.secret_id, row.name, _dump(row)])
        if not int(added):
            raise AlreadyExists(f"a secret named '{row.name}' exists")

    @_reachable
    async def update(self, row: SecretRow) -> None:
        await self._update(keys=[self.keys.secrets], args=[row.secret_id, _dump(row)])

    @_reachable
    async def get(self, team_id: str, id_or_name: str) -> SecretRow | None:
        raw = await self._get(keys=self._team_keys(team_id)[:2],
                              args=[id_or_name, id_or_name.lower(), team_id])
        return _load(raw) if raw else None

    @_reachable
    async def list(self, team_id: str, *, after: str | None,
                   limit: int) -> builtins.list[SecretRow]:
        """Ordered by name; those after ``after``."""
        rows = await self._page(keys=self._team_keys(team_id),
                                args=["(" + after if after else "-", limit])
        return [_load(r) for r in rows]

    @_reachable
    async def delete(self, secret_id: str) -> None:
        raw = await self.redis.hget(self.keys.secrets, secret_id)
        if not raw:
            return
        row = _load(raw)
        await self._delete(keys=self._team_keys(row.team_id), args=[secret_id, row.name])

    @_reachable
    async def count(self, team_id: str) -> int:
        return int(await self.redis.zcard(self.keys.secret_order(team_id)))
