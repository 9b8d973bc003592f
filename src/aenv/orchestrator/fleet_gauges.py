"""The node's Prometheus gauges (``core/telemetry.py``), set from its state every
``INTERVAL_S``: sandboxes by state, what the pools hold ready, what the sandboxes up were
given against what the machine has and uses (memory overcommit), and every 30 s the bytes
its blob cache and layer store hold. One owner runs it (the
supervisor); a failed pass is logged and the next one sets them again."""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter

from aenv.core import telemetry
from aenv.core.host_load import CpuMeter, memory
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.team_quota import Usage, is_up

log = logging.getLogger("aenv.orchestrator.fleet_gauges")

INTERVAL_S = 5.0
#: The caches are walked every this many passes (30 s).
CACHE_EVERY = 6


async def measure(node: Node, cpu: CpuMeter) -> None:
    """One pass: every gauge set from the node as it is now."""
    records = await node.store.list(list(SandboxState))
    states = Counter(r.state for r in records)
    for state in SandboxState:
        telemetry.SANDBOXES.labels(state=state.value).set(states.get(state, 0))
    telemetry.POOL_READY.labels(pool="warm").set(node.warm.ready)
    telemetry.POOL_READY.labels(pool="precreated").set(node.precreated.ready)
    telemetry.POOL_READY.labels(pool="resume_ready").set(node.resume_ready.ready)
    telemetry.POOL_READY.labels(pool="network_slots").set(node.pool.ready_count)
    given = Usage.of(records)
    cpus = sum(r.cpu_count for r in records if is_up(r))
    telemetry.ALLOCATED.labels(resource="cpus").set(cpus)
    telemetry.ALLOCATED.labels(resource="memory_bytes").set(given.memory_mb << 20)
    used, total = await asyncio.to_thread(memory)
    telemetry.HOST.labels(resource="cpus").set(os.cpu_count() or 1)
    telemetry.HOST.labels(resource="cpu_busy_ratio").set(
        await asyncio.to_thread(cpu.percent) / 100)
    telemetry.HOST.labels(resource="memory_total_bytes").set(total)
    telemetry.HOST.labels(resource="memory_used_bytes").set(used)
    telemetry.OVERCOMMIT.set(round((given.memory_mb << 20) / used, 3) if used else 0.0)


async def measure_caches(node: Node) -> None:
    """What the caches hold on disk: a walk of each, so every ``CACHE_EVERY`` passes."""
    blob = await asyncio.to_thread(node.repository.cache.usage)
    layers = await asyncio.to_thread(node.images.cache.usage)
    telemetry.CACHE_BYTES.labels(cache="blob_cache").set(blob)
    telemetry.CACHE_BYTES.labels(cache="layers").set(layers)


async def run_gauges_loop(node: Node) -> None:
    cpu = CpuMeter()
    passes = 0
    while True:
        try:
            if passes % CACHE_EVERY == 0:
                await measure_caches(node)
            passes += 1
            await measure(node, cpu)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node gauges: a pass failed; the next one retries")
        await asyncio.sleep(INTERVAL_S)
