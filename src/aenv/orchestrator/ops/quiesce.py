"""Close every host-side connection into a sandbox before its memory is saved.

The runtime cannot save a connected guest TCP endpoint (measured on the default driver in
tests/runtime/test_checkpoint.py: the save is refused, or goes through and the restored envd
accepts connections and never answers them). When the *host* closes first, the guest's endpoints
finish their passive close before the save and restores answer. So before a checkpoint the node
holds new connections back (they wait, then go ahead), lets connects under way finish their
handshake (one cut mid-handshake leaves a SYN-RECV endpoint the save crashes on), ends proxied
streams, closes its pooled connections to envd, and gives the guest a moment to process the
FINs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aenv.core.net import NetSlot
from aenv.orchestrator.context import Node

#: Time for the guest's netstack and envd to process the host's FINs (a few ms measured).
SETTLE_S = 0.02


@contextlib.asynccontextmanager
async def quiesced(node: Node, sandbox_id: str, slot: NetSlot) -> AsyncIterator[None]:
    """Inside: no connection into the sandbox is open or being opened (new ones wait)."""
    async with node.guests.held(slot):
        node.streams.abort(sandbox_id)
        await node.guests.forget(slot)
        await asyncio.sleep(SETTLE_S)
        yield
