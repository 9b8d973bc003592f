"""Heartbeats: a node writes its state, schedulers and gateways read every node's.

A heartbeat is one Lua script, so a reader never sees half of one: the node hash (stamped
with Redis's clock), the roster, and the end of the reservations it now counts. The node
reads Redis's clock (``now_ms``) *before* it measures itself and passes that as
``measured_ms``: every reservation committed before that moment is in the node's own counts,
so it leaves the ``committed`` set (``reserve.py``) in the same script. One committed later
stays counted there until the next heartbeat, so a create is never counted zero times.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.model import NodeInfo

_HEARTBEAT = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local node, roster, committed, nodes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local measured_ms, node_id, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local i = 4
for _ = 1, n do
  redis.call('HSET', node, ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', node, 'heartbeat_ms', now_ms)
redis.call('SADD', nodes, node_id)
redis.call('DEL', roster)
for j = i, #ARGV, 500 do
  redis.call('SADD', roster, unpack(ARGV, j, math.min(j + 499, #ARGV)))
end
redis.call('ZREMRANGEBYSCORE', committed, '-inf', measured_ms)
return now_ms
"""


async def now_ms(redis: Redis) -> int:
    """Redis's clock, in ms: the one clock every part of the cluster compares with."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def heartbeat(redis: Redis, keys: Keys, info: NodeInfo, roster: Iterable[str],
                    measured_ms: int) -> int:
    """Write ``info`` and ``roster`` as node ``info.node_id``'s heartbeat; Redis's time of it."""
    fields = info.to_redis()
    argv: list[str | int] = [measured_ms, info.node_id, len(fields)]
    for name, value in fields.items():
        argv += [name, value]
    argv += sorted(roster)
    script = redis.register_script(_HEARTBEAT)
    stamped = await script(
        keys=[keys.node(info.node_id), keys.roster(info.node_id), keys.committed(info.node_id),
              keys.nodes],
        args=argv)
    return int(stamped)


async def nodes(redis: Redis, keys: Keys) -> tuple[list[NodeInfo], int]:
    """Every node's last heartbeat, and Redis's clock now (to judge their ages by)."""
    ids = sorted(_text(m) for m in await redis.smembers(keys.nodes))
    found = []
    if ids:
        async with redis.pipeline(transaction=False) as pipe:
            for node_id in ids:
                pipe.hgetall(keys.node(node_id))
            hashes = await pipe.execute()
        found = [NodeInfo.from_redis(h) for h in hashes if h]
    return found, await now_ms(redis)


async def roster(redis: Redis, keys: Keys, node_id: str) -> set[str]:
    return {_text(m) for m in await redis.smembers(keys.roster(node_id))}


async def forget(redis: Redis, keys: Keys, node_id: str) -> None:
    """Remove a node from the cluster's state (an operator's ``aenv node rm``)."""
    await redis.delete(keys.node(node_id), keys.roster(node_id), keys.pending(node_id),
                       keys.committed(node_id), keys.team_usage(node_id))
    await redis.srem(keys.nodes, node_id)


def _text(value: bytes | str) -> str:
    """A reply as text (clients are made with ``decode_responses=True``; this is the type's
    other half)."""
    return value.decode() if isinstance(value, bytes) else value
