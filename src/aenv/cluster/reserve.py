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

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.registry import now_ms

#: An open reservation lives this long unless committed or cancelled: longer than a slow
#: create (a cold image pull is bounded by the node's own timeouts).
RESERVATION_TTL_MS = 120_000
#: A committed sandbox counts against its key's quota at least this long, roster or not:
#: longer than a heartbeat interval, so a sandbox just made is not dropped before its
#: node's roster names it.
QUOTA_GRACE_MS = 30_000

_RESERVE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local node, pending, committed, reservation = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local key_pending, key_sandboxes = KEYS[5], KEYS[6]
local rid, want, ttl_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fresh_ms, partial, node_id = tonumber(ARGV[4]), ARGV[5] == '1', ARGV[6]
local quota, has_key = tonumber(ARGV[7]), ARGV[8] == '1'
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
if quota > 0 then
  redis.call('ZREMRANGEBYSCORE', key_pending, '-inf', now_ms)
  local room = quota - redis.call('ZCARD', key_pending) - redis.call('ZCARD', key_sandboxes)
  if room <= 0 or (room < grant and not partial) then return {0, 'quota'} end
  grant = math.min(grant, room)
  for i = 1, grant do
    redis.call('ZADD', key_pending, now_ms + ttl_ms, rid .. '#' .. i)
  end
  redis.call('PEXPIRE', key_pending, ttl_ms * 2)
end
if has_key then
  redis.call('HSET', reservation, 'key_pending', key_pending, 'key_sandboxes', key_sandboxes)
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
local f = redis.call('HMGET', reservation, 'node', 'count', 'key_pending', 'key_sandboxes')
if not f[1] then return 0 end
if f[3] then
  -- The key's slots: held no more; a committed create's sandboxes count until they are gone.
  for i = 1, tonumber(f[2]) do redis.call('ZREM', f[3], rid .. '#' .. i) end
  if commit then
    for i = 4, #ARGV do redis.call('ZADD', f[4], now_ms, ARGV[i]) end
  end
end
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
    draining, unknown, quota)."""

    node_id: str
    reservation_id: str
    count: int
    reason: str


async def reserve(redis: Redis, keys: Keys, node_id: str, reservation_id: str, count: int, *,
                  fresh_s: float, partial: bool = False, key_id: str | None = None,
                  quota: int = 0, ttl_ms: int = RESERVATION_TTL_MS) -> Grant:
    """Hold ``count`` slots on ``node_id`` if its heartbeat is younger than ``fresh_s`` and it
    is ready; with ``partial``, as many as are free (at least one). With ``key_id``, the
    sandboxes its ``commit`` names count as the API key's (``forget`` and ``forget_gone``
    drop them); with a ``quota`` (> 0) too, the grant stays within it: the key's open
    reservations plus its sandboxes."""
    script = redis.register_script(_RESERVE)
    key = key_id or "-"
    granted, reason = await script(
        keys=[keys.node(node_id), keys.pending(node_id), keys.committed(node_id),
              keys.reservation(reservation_id), keys.key_pending(key), keys.key_sandboxes(key)],
        args=[reservation_id, count, ttl_ms, int(fresh_s * 1000), "1" if partial else "0",
              node_id, quota if key_id else 0, "1" if key_id else "0"])
    return Grant(node_id, reservation_id, int(granted),
                 reason.decode() if isinstance(reason, bytes) else str(reason))


async def commit(redis: Redis, keys: Keys, reservation_id: str,
                 sandbox_ids: Sequence[str] = ()) -> int:
    """The create succeeded: its slots count as committed until the node's next heartbeat,
    and ``sandbox_ids`` against the API key's quota (if the reservation had one)."""
    return await _settle(redis, keys, reservation_id, commit=True, sandbox_ids=sandbox_ids)


async def cancel(redis: Redis, keys: Keys, reservation_id: str) -> int:
    """The create failed or was not sent: its slots are free now."""
    return await _settle(redis, keys, reservation_id, commit=False)


async def _settle(redis: Redis, keys: Keys, reservation_id: str, *, commit: bool,
                  sandbox_ids: Sequence[str] = ()) -> int:
    script = redis.register_script(_SETTLE)
    moved = await script(keys=[keys.reservation(reservation_id)],
                         args=[reservation_id, "1" if commit else "0", keys.prefix,
                               *sandbox_ids])
    return int(moved)


async def count(redis: Redis, keys: Keys, key_id: str, sandbox_id: str) -> None:
    """``sandbox_id``, made without a reservation (a fork's children on their parent's
    node), counts against ``key_id``'s quota from now."""
    await redis.zadd(keys.key_sandboxes(key_id), {sandbox_id: await now_ms(redis)})


async def forget(redis: Redis, keys: Keys, key_id: str, sandbox_id: str) -> None:
    """``sandbox_id`` no longer counts against ``key_id``'s quota (it was killed)."""
    await redis.zrem(keys.key_sandboxes(key_id), sandbox_id)


async def forget_gone(redis: Redis, keys: Keys, *, grace_ms: int = QUOTA_GRACE_MS) -> int:
    """Drop from every key's quota the sandboxes no node's roster holds (they ended on their
    own: a timeout, a crash) and committed more than ``grace_ms`` ago (a new sandbox is in
    its node's roster from the next heartbeat on); how many were dropped."""
    held: set[str] = set()
    for node_id in await redis.smembers(keys.nodes):
        held |= {str(m) for m in await redis.smembers(keys.roster(str(node_id)))}
    now = await now_ms(redis)
    dropped = 0
    async for name in redis.scan_iter(match=keys.key_sandboxes("*"), count=100):
        old = await redis.zrangebyscore(name, "-inf", now - grace_ms)
        gone = [str(sid) for sid in old if str(sid) not in held]
        if gone:
            dropped += int(await redis.zrem(name, *gone))
    return dropped
