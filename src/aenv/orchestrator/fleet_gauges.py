"""The node's Prometheus gauges (``core/telemetry.py``), set from its state every
``INTERVAL_S``: sandboxes by state, what the pools hold ready, what the sandboxes up were
given against what the machine has and uses (memory overcommit). One owner runs it (the
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
from aenv.orchestrator.team_quota import Usage

log = logging.getLogger("aenv.orchestrator.fleet_gauges")

INTERVAL_S = 5.0


async def measure(node: Node, cpu: CpuMeter) -> None:
    """One pass: every gauge set from the node as it is now."""
    records = await node.store.list(list(SandboxState))
    states = Counter(r.state for r in records)
    for state in SandboxState:
        telemetry.SANDBOXES.labels(state=state.value).set(states.get(state, 0))
    telemetry.POOL_READY.labels(pool="warm").set(node.warm.ready)
    telemetry.POOL_READY.labels(pool="precreated").set(node.precreated.ready)
    telemetry.POOL_READY.labels(pool="network_slots").set(node.pool.ready_count)
    given = Usage.of(records)
    cpus = sum(r.cpu_count for r in records if Usage.of([r]).count)  # those up
    telemetry.ALLOCATED.labels(resource="cpus").set(cpus)
    telemetry.ALLOCATED.labels(resource="memory_bytes").set(given.memory_mb << 20)
    used, total = await asyncio.to_thread(memory)
    telemetry.HOST.labels(resource="cpus").set(os.cpu_count() or 1)
    telemetry.HOST.labels(resource="cpu_busy_ratio").set(
        await asyncio.to_thread(cpu.percent) / 100)
    telemetry.HOST.labels(resource="memory_total_bytes").set(total)
    telemetry.HOST.labels(resource="memory_used_bytes").set(used)
    telemetry.OVERCOMMIT.set(round((given.memory_mb << 20) / used, 3) if used else 0.0)


async def run_gauges_loop(node: Node) -> None:
    cpu = CpuMeter()
    while True:
        try:
            await measure(node, cpu)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node gauges: a pass failed; the next one retries")
        await asyncio.sleep(INTERVAL_S)
