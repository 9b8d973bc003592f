"""Peer fetch (``peer_fetch = true``, off by default): a blob this node lacks comes from
another node of the cluster that has it, before the shared repository.

Which node has it: every ready node but this one is asked at once (``HEAD
/node/blobs/{digest}``, bounded by ``ASK_TIMEOUT_S``); the first that has it streams it
(``GET``). No directory of who holds what is kept: a node's blob cache changes with every
fetch and trim, and asking costs one LAN round trip per node, against a download from the
repository. The bytes are checked against the digest by the blob cache
(``storage/blobs.py``), and any failure there (no peer has it, a peer fails midway, a
corrupt copy) falls back to the repository, so a peer can cost time but never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
from redis.asyncio import Redis

from aenv.cluster.cache import ClusterCache
from aenv.cluster.keys import Keys
from aenv.cluster.model import Health

log = logging.getLogger("aenv.cluster.peer_fetch")

#: A peer that has not said within this whether it has a blob is not waited for.
ASK_TIMEOUT_S = 1.0
#: Heartbeats are read again at most this often for the list of peers.
PEERS_TTL_S = 2.0


class PeerBlobs:
    """A :class:`aenv.storage.blobs.BlobSource` over the other nodes of a cluster."""

    def __init__(self, redis: Redis, keys: Keys, own_id: str, api_key: str) -> None:
        self.cache = ClusterCache(redis, keys, nodes_ttl_s=PEERS_TTL_S)
        self.own_id = own_id
        self.http = httpx.AsyncClient(
            headers={"X-API-KEY": api_key},
            timeout=httpx.Timeout(60.0, connect=ASK_TIMEOUT_S))

    async def close(self) -> None:
        await self.http.aclose()

    async def peers(self) -> list[str]:
        nodes, now = await self.cache.nodes()
        return [n.address for n in nodes
                if n.node_id != self.own_id and n.health(now) is Health.READY]

    async def open(self, digest: str) -> AsyncIterator[bytes] | None:
        peer = await self._holder(digest)
        if peer is None:
            return None
        log.info("fetching blob %s from peer %s", digest, peer)
        return self._stream(f"{peer}/node/blobs/{digest}")

    async def _holder(self, digest: str) -> str | None:
        """The first peer that says it has ``digest``, or None."""
        peers = await self.peers()
        if not peers:
            return None
        asks = {asyncio.ensure_future(self._has(peer, digest)): peer for peer in peers}
        try:
            for done in asyncio.as_completed(asks, timeout=ASK_TIMEOUT_S):
                with contextlib.suppress(httpx.HTTPError):
                    if found := await done:
                        return found
        except TimeoutError:
            pass
        finally:
            for ask in asks:
                ask.cancel()
        return None

    async def _has(self, peer: str, digest: str) -> str | None:
        answer = await self.http.head(f"{peer}/node/blobs/{digest}", timeout=ASK_TIMEOUT_S)
        return peer if answer.status_code == 200 else None

    async def _stream(self, url: str) -> AsyncIterator[bytes]:
        async with self.http.stream("GET", url) as answer:
            answer.raise_for_status()
            async for chunk in answer.aiter_bytes():
                yield chunk
