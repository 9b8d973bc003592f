"""The teams' usage across a cluster (docs/teams.md, "Quotas"): the ledger a node checks a
team's quota against before it starts a sandbox (``orchestrator/team_quota.py``'s
``SharedUsage``).

What a team uses, cluster-wide = what each node last published for it (``team_usage`` of
that node: its sandboxes up, their memory, the disk of those up or paused), counted only
while the node's heartbeat is younger than ``LOST_AFTER_S``, + every open hold of the team
(``team_held``: starts in flight on any node). The check and the hold are one script, so 40
concurrent starts on three nodes cannot all take the last sandbox.

A publication carries the cluster's clock read *before* the node listed its store, and
replaces the node's last one only if it is newer: a sandbox in the store when a newer
listing began is in that listing. A start releases its hold in the same script that
publishes the usage counting its sandbox, so it is never counted zero times (nor twice,
but for a moment). A hold whose node died expires after ``HOLD_TTL_MS``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.model import LOST_AFTER_S
from aenv.cluster.registry import now_ms
from aenv.orchestrator.team_quota import Quota, Usage, check

#: An open hold lives this long unless released: longer than a slow start (a cold pull is
#: bounded by the node's own timeouts), as a scheduler's reservation.
HOLD_TTL_MS = 120_000

# KEYS: the set of nodes, the team's holds. ARGV: the key prefix, the team, the hold's
# member, what it needs (sandboxes, MB of memory, MB of disk), the limits (0: none), the
# lost bound and the hold's life in ms. {1}: held; {0, used sandboxes, memory, disk}.
_HOLD = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local nodes, held = KEYS[1], KEYS[2]
local prefix, team, member = ARGV[1], ARGV[2], ARGV[3]
local need = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])}
local limit = {tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])}
local lost_ms, ttl_ms = tonumber(ARGV[10]), tonumber(ARGV[11])
local used = {0, 0, 0}
local function add(text)
  local i = 0
  for part in string.gmatch(text, '[^:]+') do
    if i > 0 then used[i] = used[i] + tonumber(part) end
    i = i + 1
  end
end
for _, id in ipairs(redis.call('SMEMBERS', nodes)) do
  local beat = redis.call('HGET', prefix .. ':node:' .. id, 'heartbeat_ms')
  if beat and now_ms - tonumber(beat) < lost_ms then
    local usage = redis.call('HGET', prefix .. ':node:' .. id .. ':teams', team)
    if usage then add(usage) end
  end
end
redis.call('ZREMRANGEBYSCORE', held, '-inf', now_ms)
for _, open in ipairs(redis.call('ZRANGE', held, 0, -1)) do add(open) end
for i = 1, 3 do
  if limit[i] > 0 and used[i] + need[i] > limit[i] then
    return {0, used[1], used[2], used[3]}
  end
end
redis.call('ZADD', held, now_ms + ttl_ms, member)
redis.call('PEXPIRE', held, ttl_ms * 2)
return {1}
"""

# KEYS: the node's usage hash, a team's holds (any key when nothing is released). ARGV: the
# stamp, the hold to release ('' none), '1' if the teams given are all the node's (any other
# is dropped), then (team, sandboxes, MB of memory, MB of disk) repeated. A publication
# stamped in the same millisecond as the one held replaces it: it listed the store later (a
# kill's publication right after a start's was dropped, and its room freed only at the
# next heartbeat).
_PUBLISH = """
local usage, held = KEYS[1], KEYS[2]
local measured, release, whole = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
local function stamp(value) return tonumber(string.match(value, '^(%d+):')) end
local given = {}
for i = 4, #ARGV, 4 do
  local team = ARGV[i]
  given[team] = true
  local old = redis.call('HGET', usage, team)
  if not old or stamp(old) <= measured then
    redis.call('HSET', usage, team,
               measured .. ':' .. ARGV[i + 1] .. ':' .. ARGV[i + 2] .. ':' .. ARGV[i + 3])
  end
end
if whole then
  local all = redis.call('HGETALL', usage)
  for j = 1, #all, 2 do
    if not given[all[j]] and stamp(all[j + 1]) <= measured then
      redis.call('HDEL', usage, all[j])
    end
  end
end
if release ~= '' then redis.call('ZREM', held, release) end
return 1
"""


class ClusterTeamUsage:
    """This node's side of the ledger (``SharedUsage``), on the cluster's Redis."""

    def __init__(self, redis: Redis, keys: Keys, node_id: str, *,
                 hold_ttl_ms: int = HOLD_TTL_MS, lost_after_s: float = LOST_AFTER_S) -> None:
        self.redis = redis
        self.keys = keys
        self.node_id = node_id
        self.hold_ttl_ms = hold_ttl_ms
        self.lost_after_ms = int(lost_after_s * 1000)
        self._hold = redis.register_script(_HOLD)
        self._publish = redis.register_script(_PUBLISH)

    async def clock_ms(self) -> int:
        return await now_ms(self.redis)

    async def hold(self, team: str, quota: Quota, need: Usage) -> str:
        member = f"{uuid.uuid4().hex}:{need.count}:{need.memory_mb}:{need.disk_mb}"
        limits = (quota.max_sandboxes, quota.max_memory_mb, quota.max_disk_mb)
        answer = await self._hold(
            keys=[self.keys.nodes, self.keys.team_held(team)],
            args=[self.keys.prefix, team, member, need.count, need.memory_mb, need.disk_mb,
                  *(int(limit or 0) for limit in limits), self.lost_after_ms,
                  self.hold_ttl_ms])
        if int(answer[0]) == 1:
            return member
        used = Usage(*(int(v) for v in answer[1:4]))
        check(quota, used + need, " across the cluster")
        # The script and ``check`` read the limits alike; reaching here is a bug in either.
        raise AssertionError(f"the cluster refused {need} for team {team} within {quota}")

    async def publish(self, team: str, mine: Usage, measured_ms: int, *,
                      release: str | None = None) -> None:
        await self._publish(
            keys=[self.keys.team_usage(self.node_id), self.keys.team_held(team)],
            args=[measured_ms, release or "", "0", team, mine.count, mine.memory_mb,
                  mine.disk_mb])

    async def publish_all(self, usage: Mapping[str, Usage], measured_ms: int) -> None:
        argv: list[str | int] = [measured_ms, "", "1"]
        for team, used in sorted(usage.items()):
            argv += [team, used.count, used.memory_mb, used.disk_mb]
        own = self.keys.team_usage(self.node_id)
        await self._publish(keys=[own, own], args=argv)
