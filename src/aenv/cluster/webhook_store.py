"""The cluster's lifecycle webhooks in Redis (``orchestrator/webhooks.py``'s
:class:`WebhookDefs`): a webhook registered through any gateway or node is every node's, and
each node delivers the events of the sandboxes it runs, from its own outbox — so each event
goes out once, from the node it happened on (docs/webhooks.md, "In a cluster").

Owns the webhook keys of ``keys.py``: ``webhooks``, a hash of every webhook by id, and per
team ``webhooks`` (the ids, scored by when each was made). A write and a delete are each one
Lua script, so a team's list never names a webhook that is gone, nor misses one that is
there. Redis holds the signing secret only as ``Vault`` sealed it (base64 in the row's JSON).
Redis that cannot be reached is ``Unavailable`` (503).
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import reachable
from aenv.store.webhooks import WebhookRow

# KEYS: webhooks, the team's ids; ARGV: id, row JSON, created_at.
_PUT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(ARGV[3]), ARGV[1])
return 1
"""
# KEYS: webhooks, the team's ids; ARGV: id. 0: it was gone.
_DELETE = """
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
"""
# KEYS: webhooks, the team's ids. The team's rows, oldest first.
_OF_TEAM = """
local ids = redis.call('ZRANGE', KEYS[2], 0, -1)
if #ids == 0 then return {} end
local rows = redis.call('HMGET', KEYS[1], unpack(ids))
local out = {}
for i = 1, #ids do
  if rows[i] then out[#out + 1] = rows[i] end
end
return out
"""

_reachable = reachable("the cluster's webhooks")


def _dump(row: WebhookRow) -> str:
    fields = asdict(row)
    fields["events"] = list(row.events)
    fields["sealed_secret"] = base64.b64encode(row.sealed_secret).decode() \
        if row.sealed_secret is not None else None
    return json.dumps(fields)


def _load(raw: str | bytes) -> WebhookRow:
    fields = json.loads(raw)
    sealed = fields["sealed_secret"]
    return WebhookRow(**{**fields, "events": tuple(fields["events"]),
                         "sealed_secret": base64.b64decode(sealed) if sealed else None})


class RedisWebhookStore:
    def __init__(self, redis: Redis, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self._put = redis.register_script(_PUT)
        self._delete = redis.register_script(_DELETE)
        self._of_team = redis.register_script(_OF_TEAM)

    async def close(self) -> None:
        await self.redis.aclose()

    @_reachable
    async def put(self, row: WebhookRow) -> None:
        """Insert or replace the webhook."""
        await self._put(keys=[self.keys.webhooks, self.keys.team_webhooks(row.team_id)],
                        args=[row.webhook_id, _dump(row), row.created_at])

    @_reachable
    async def get(self, webhook_id: str) -> WebhookRow | None:
        raw = await self.redis.hget(self.keys.webhooks, webhook_id)
        return _load(raw) if raw else None

    @_reachable
    async def of_team(self, team_id: str) -> list[WebhookRow]:
        rows = await self._of_team(keys=[self.keys.webhooks,
                                         self.keys.team_webhooks(team_id)])
        return [_load(r) for r in rows]

    @_reachable
    async def delete(self, webhook_id: str) -> bool:
        raw = await self.redis.hget(self.keys.webhooks, webhook_id)
        if not raw:
            return False
        team = _load(raw).team_id
        gone = await self._delete(keys=[self.keys.webhooks, self.keys.team_webhooks(team)],
                                  args=[webhook_id])
        return bool(int(gone))
