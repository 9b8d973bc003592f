"""Which node a sandbox is on: bindings in Redis, rebuilt from the nodes' rosters.

A binding is ``sandbox id → (node id, fencing token)``. It is written only by
compare-and-set (``bind``: the new token must be one more than the one stored, or the
binding must not exist for token 1), so two gateways moving one sandbox cannot both win,
and a cached binding with an older token is known to be stale.

A sandbox with no binding (Redis was wiped, or failed over before the write reached the
replica) is looked for in every node's roster, and bound again where it is found: the nodes
are the truth for what they run.
"""

from __future__ import annotations

from redis.asyncio import Redis

from aenv.cluster.keys import Keys

_BIND = """
local current = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
local wanted = tonumber(ARGV[2])
if wanted ~= current + 1 then return current end
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'token', wanted)
return wanted
"""


async def bind(redis: Redis, keys: Keys, sandbox_id: str, node_id: str, token: int) -> bool:
    """Bind ``sandbox_id`` to ``node_id`` with fencing ``token`` (the stored one + 1; 1 for a
    new binding); False if another writer got there first."""
    script = redis.register_script(_BIND)
    stored = await script(keys=[keys.binding(sandbox_id)], args=[node_id, token])
    return int(stored) == token


async def lookup(redis: Redis, keys: Keys, sandbox_id: str) -> tuple[str, int] | None:
    """(node id, token) of ``sandbox_id``'s binding, else from the rosters (and bound)."""
    found = await redis.hmget(keys.binding(sandbox_id), ["node", "token"])
    if found[0] is not None:
        return str(found[0]), int(found[1] or 0)
    for node_id in sorted(await redis.smembers(keys.nodes)):
        if await redis.sismember(keys.roster(str(node_id)), sandbox_id):
            await bind(redis, keys, sandbox_id, str(node_id), 1)
            return str(node_id), 1
    return None


async def unbind(redis: Redis, keys: Keys, sandbox_id: str) -> None:
    await redis.delete(keys.binding(sandbox_id))
