"""A team's ``startsPerSecond`` held across the cluster (docs/teams.md, "Quotas"): every
gateway counts the team's starts (creates, fork children) in one Redis counter per second,
so two gateways together start no more than one would. A node holds the same quota for what
it starts (``orchestrator/team_quota.py``); this is the cluster's sum.

A fixed one-second window, as the node's burst of one second's worth: at most
``ceil(starts_per_s)`` starts in any second (at least one; a fork of more children than
that is refused whole, as on a node). The check and the count are one
script, so concurrent gateways cannot both take the last start; a refused start takes
nothing. Redis that cannot be reached is the caller's ``RedisError`` (the gateway's 503).
"""

from __future__ import annotations

import math

from redis.asyncio import Redis

from aenv.cluster.keys import Keys

# KEYS: the team's counter; ARGV: the second, how many, the limit. 1: taken; 0: over.
_TAKE = """
local raw = redis.call('GET', KEYS[1])
local second, used = ARGV[1], 0
if raw then
  local at, count = string.match(raw, '^(%d+):(%d+)$')
  if at == second then used = tonumber(count) end
end
local want, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
if used + want > limit then return 0 end
redis.call('SET', KEYS[1], second .. ':' .. (used + want), 'PX', 2000)
return 1
"""


class TeamRate:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._take = redis.register_script(_TAKE)

    async def take(self, team_id: str, starts_per_s: float, count: int = 1) -> bool:
        """Count ``count`` starts of ``team_id`` in this second if its quota allows them."""
        now = await self._redis.time()  # Redis's clock: one for every gateway
        limit = max(1, math.ceil(starts_per_s))
        taken = await self._take(keys=[self._keys.team_starts(team_id)],
                                 args=[int(now[0]), count, limit])
        return bool(taken)
