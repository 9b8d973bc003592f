"""A gateway's short-lived copy of the cluster state it reads on every sandbox call.

Without it, every call on a sandbox costs four Redis round trips before the first byte goes
to the node (the binding, the node set, every heartbeat, Redis's clock). Two caches:

* **Nodes**: every heartbeat and Redis's clock, read at most every ``NODES_TTL_S``. The
  clock is carried forward with this process's monotonic clock between reads, so a node's
  health is judged as if read now; the staleness is at most ``NODES_TTL_S``, against
  heartbeats seconds apart.
* **Bindings**: sandbox → (node, fencing token), kept ``BINDING_TTL_S``, at most
  ``MAX_BINDINGS``. A move by *this* gateway updates it at once. A move by another gateway
  is seen when the entry expires, or sooner: a call sent by a cached binding that the node
  answers 404 is looked up again in Redis, and a binding with a newer token than the cached
  one means the sandbox moved (:meth:`ClusterCache.moved`).
"""

from __future__ import annotations

import time
from collections import OrderedDict

from redis.asyncio import Redis

from aenv.cluster import bindings, registry
from aenv.cluster.keys import Keys
from aenv.cluster.model import NodeInfo

NODES_TTL_S = 0.25
BINDING_TTL_S = 2.0
MAX_BINDINGS = 100_000

Binding = tuple[str, int]


class ClusterCache:
    def __init__(self, redis: Redis, keys: Keys, *, nodes_ttl_s: float = NODES_TTL_S,
                 binding_ttl_s: float = BINDING_TTL_S) -> None:
        self.redis = redis
        self.keys = keys
        self.nodes_ttl_s = nodes_ttl_s
        self.binding_ttl_s = binding_ttl_s
        self._nodes: tuple[list[NodeInfo], int, float] | None = None
        self._bindings: OrderedDict[str, tuple[Binding, float]] = OrderedDict()

    async def nodes(self) -> tuple[list[NodeInfo], int]:
        """Every node's last heartbeat and Redis's clock now (estimated between reads)."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[2] >= self.nodes_ttl_s:
            found, redis_ms = await registry.nodes(self.redis, self.keys)
            self._nodes = (found, redis_ms, now)
        found, redis_ms, read_at = self._nodes
        return found, redis_ms + int((now - read_at) * 1000)

    async def binding(self, sandbox_id: str) -> tuple[Binding | None, bool]:
        """The sandbox's binding, and whether it came from the cache."""
        cached = self._bindings.get(sandbox_id)
        if cached is not None and time.monotonic() - cached[1] < self.binding_ttl_s:
            return cached[0], True
        return await self._read(sandbox_id), False

    async def moved(self, sandbox_id: str, stale: Binding) -> Binding | None:
        """Redis's binding if it is newer than ``stale`` (the sandbox moved), else None."""
        fresh = await self._read(sandbox_id)
        return fresh if fresh is not None and fresh[1] > stale[1] else None

    def remember(self, sandbox_id: str, node_id: str, token: int) -> None:
        self._bindings[sandbox_id] = ((node_id, token), time.monotonic())
        self._bindings.move_to_end(sandbox_id)
        while len(self._bindings) > MAX_BINDINGS:
            self._bindings.popitem(last=False)

    def forget(self, sandbox_id: str) -> None:
        self._bindings.pop(sandbox_id, None)

    async def _read(self, sandbox_id: str) -> Binding | None:
        found = await bindings.lookup(self.redis, self.keys, sandbox_id)
        if found is None:
            self.forget(sandbox_id)
        else:
            self.remember(sandbox_id, *found)
        return found
