"""The node's garbage-collection loop over the repository (``storage/gc.py`` has the rules).

One pass every ``gc_interval_s`` (and on ``POST /repository/gc``); a failed pass (the store
unreachable) is logged and the next one tries again. Passes never overlap on one node.
"""

from __future__ import annotations

import asyncio
import logging

from aenv.core.errors import AenvError
from aenv.orchestrator import disk_mode
from aenv.orchestrator.context import Node
from aenv.storage.gc import CollectionPlan

log = logging.getLogger("aenv.orchestrator.gc")

_running = asyncio.Lock()


async def collect(node: Node) -> CollectionPlan:
    """One pass now (waits for a pass in progress to finish first)."""
    async with _running:
        plan = await node.repository.collect_garbage(grace_s=node.settings.gc_grace_s)
        if dropped := disk_mode.drop_stale_disks(node):
            log.info("gc: removed %d local disk images (of deleted snapshots, or left by a "
                     "crash)", dropped)
        trimmed = await node.repository.trim_cache()
        if trimmed:
            log.info("gc: dropped %d cached blobs over the cache's budget", len(trimmed))
        return plan


async def run_gc_loop(node: Node) -> None:
    """A pass every ``gc_interval_s``; after a failed pass the next comes sooner (30 s,
    doubling up to the interval), each failure logged with its count."""
    failures = 0
    while True:
        interval = node.settings.gc_interval_s
        await asyncio.sleep(min(interval, 30.0 * 2 ** (failures - 1)) if failures else interval)
        try:
            await collect(node)
            failures = 0
        except Exception as exc:
            failures += 1
            log.warning("gc pass failed (%d in a row; next in %.0f s): %s", failures,
                        min(interval, 30.0 * 2 ** (failures - 1)),
                        getattr(exc, "message", None) or repr(exc),
                        exc_info=not isinstance(exc, AenvError))
