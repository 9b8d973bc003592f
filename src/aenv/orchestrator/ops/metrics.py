"""Sandbox metrics, sampled from envd inside the sandbox."""

from __future__ import annotations

from dataclasses import dataclass

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.instance_codec import decode
from aenv.runtime.base import Stats


@dataclass(frozen=True)
class MetricSample:
    """One sample: when it was taken, and the sandbox's usage in the runtime's own shape."""

    timestamp: float
    stats: Stats


async def sample(node: Node, sandbox_id: str) -> MetricSample | None:
    """A live sample, or ``None`` when the sandbox is not running (paused: no CPU, no memory)."""
    record = await node.store.require_visible(sandbox_id)
    if record.state != SandboxState.RUNNING:
        if record.state == SandboxState.PAUSED:
            return None
        raise Conflict(f"sandbox {sandbox_id} is {record.state}")
    slot, _ = decode(record.instance, sandbox_id)
    assert slot is not None
    async with EnvdClient(node.guests.transport(slot), slot) as envd:
        data = await envd.metrics(record.envd_token)
    return MetricSample(
        timestamp=node.clock(),
        stats=Stats(
            cpu_count=int(data.get("cpu_count", record.cpu_count)),
            cpu_used_pct=float(data.get("cpu_used_pct", 0.0)),
            mem_used=int(data.get("mem_used", 0)),
            mem_total=int(data.get("mem_total", 0)),
            mem_cache=int(data.get("mem_cache", 0)),
            disk_used=int(data.get("disk_used", 0)),
            disk_total=int(data.get("disk_total", 0)),
        ),
    )
