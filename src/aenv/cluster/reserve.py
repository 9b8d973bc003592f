"""Reservations: capacity on a node held for a create, resume or fork in flight.

Why a script: two schedulers that both read "one slot free" from the heartbeats and both
place there would double-book (AgentENV#191: per-node limits exceeded 3 times over with replicas).
Here the check and the booking are one Lua script on Redis, which runs scripts one at a
time, so the last slot goes to exactly one of them.

A node's used capacity = ``running`` (its last heartbeat) + open reservations (``pending``,
each expiring after ``ttl_ms`` so a crashed scheduler or gateway cannot leak capacity) +
committed ones the node's counts do not include yet (``committed``, cleared by the node's
next heartbeat: ``registry.py``). Starts in flight are bounded the same way against
``starting_limit``.

Lifecycle of one reservation: ``reserve`` → the create is sent to the node → ``commit`` (it
succeeded: the sandbox now counts as committed until the heartbeat counts it) or ``cancel``
(it failed: the slots are free at once). Neither is needed for correctness after a crash:
the pending entry expires.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from aenv.cluster.keys import Keys

#: An open reservation lives this long unless committed or cancelled: longer than a slow
#: create (a cold image pull is bounded by the node's own timeouts).
RESERVATION_TTL_MS = 120_000

_RESERVE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local node, pending, committed, reservation = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, want, ttl_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fresh_ms, partial, node_id = tonumber(ARGV[4]), ARGV[5] == '1', ARGV[6]
local f = redis.call('HMGET', node, 'state', 'limit', 'starting_limit', 'running', 'starting',
                     'heartbeat_ms')
if not f[6] then return {0, 'unknown'} end
if now_ms - tonumber(f[6]) >= fresh_ms then return {0, 'stale'} end
if cjson.decode(f[1]) ~= 'ready' then return {0, 'draining'} end
redis.call('ZREMRANGEBYSCORE', pending, '-inf', now_ms)
local held = redis.call('ZCARD', pending)
local used = tonumber(f[4]) + held + redis.call('ZCARD', committed)
local free = math.min(tonumber(f[2]) - used, tonumber(f[3]) - tonumber(f[5]) - held)
if free <= 0 then
  if tonumber(f[2]) - used <= 0 then return {0, 'full'} end
  return {0, 'busy'}
end
local grant = want
if free < want then
  if not partial then return {0, 'full'} end
  grant = free
end
for i = 1, grant do
  redis.call('ZADD', pending, now_ms + ttl_ms, rid .. '#' .. i)
end
redis.call('PEXPIRE', pending, ttl_ms * 2)
redis.call('HSET', reservation, 'node', node_id, 'count', grant)
redis.call('PEXPIRE', reservation, ttl_ms * 2)
return {grant, 'ok'}
"""

_SETTLE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local reservation, rid, commit = KEYS[1], ARGV[1], ARGV[2] == '1'
local prefix = ARGV[3]
local f = redis.call('HMGET', reservation, 'node', 'count')
if not f[1] then return 0 end
local pending = prefix .. ':node:' .. f[1] .. ':pending'
local committed = prefix .. ':node:' .. f[1] .. ':committed'
local moved = 0
for i = 1, tonumber(f[2]) do
  local member = rid .. '#' .. i
  if redis.call('ZREM', pending, member) == 1 then
    moved = moved + 1
    if commit then redis.call('ZADD', committed, now_ms, member) end
  end
end
if commit then redis.call('PEXPIRE', committed, 3600000) end
redis.call('DEL', reservation)
return moved
"""


@dataclass(frozen=True)
class Grant:
    """``count`` slots on ``node_id`` (0: refused, ``reason`` says why: full, busy, stale,
    draining, unknown)."""

    node_id: str
    reservation_id: str
    count: int
    reason: str


async def reserve(redis: Redis, keys: Keys, node_id: str, reservation_id: str, count: int, *,
                  fresh_s: float, partial: bool = False,
                  ttl_ms: int = RESERVATION_TTL_MS) -> Grant:
    """Hold ``count`` slots on ``node_id`` if its heartbeat is younger than ``fresh_s`` and it
    is ready; with ``partial``, as many as are free (at least one)."""
    script = redis.register_script(_RESERVE)
    granted, reason = await script(
        keys=[keys.node(node_id), keys.pending(node_id), keys.committed(node_id),
              keys.reservation(reservation_id)],
        args=[reservation_id, count, ttl_ms, int(fresh_s * 1000), "1" if partial else "0",
              node_id])
    return Grant(node_id, reservation_id, int(granted),
                 reason.decode() if isinstance(reason, bytes) else str(reason))


async def commit(redis: Redis, keys: Keys, reservation_id: str) -> int:
    """The create succeeded: its slots count as committed until the node's next heartbeat."""
    return await _settle(redis, keys, reservation_id, commit=True)


async def cancel(redis: Redis, keys: Keys, reservation_id: str) -> int:
    """The create failed or was not sent: its slots are free now."""
    return await _settle(redis, keys, reservation_id, commit=False)


async def _settle(redis: Redis, keys: Keys, reservation_id: str, *, commit: bool) -> int:
    script = redis.register_script(_SETTLE)
    moved = await script(keys=[keys.reservation(reservation_id)],
                         args=[reservation_id, "1" if commit else "0", keys.prefix])
    return int(moved)
