"""A node's side of cluster mode: its heartbeat, every ``heartbeat_interval_s``.

Each beat reads Redis's clock, then measures the node (``measure``): its sandboxes by state
from the store (the roster is every sandbox it holds, paused ones included: those are its
to resume until another node adopts them), creates in flight (admission), CPU and memory of
the machine, the templates it knows, its warm pool. Then one script writes it all
(``registry.heartbeat``), and another what each team holds here (``team_usage.py``).

A beat that fails (Redis down, a failover) is logged once per outage and retried at the next
interval; the node keeps serving what it runs, and schedulers stop placing on it once its
last heartbeat is older than their suspect bound (``model.py``). Nothing here may take the
node down.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from aenv.cluster import registry
from aenv.cluster.keys import Keys
from aenv.cluster.model import NodeInfo
from aenv.core.errors import InvalidArgument
from aenv.core.host_load import CpuMeter, memory
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.node_identity import node_id
from aenv.orchestrator.restore_match import requirements_key
from aenv.orchestrator.team_quota import Usage, usage_by_team

log = logging.getLogger("aenv.cluster.heartbeat")

#: States that take one of the node's ``max_sandboxes`` (as ``ops/create.check_capacity``).
RUNNING = (SandboxState.CREATING, SandboxState.RUNNING, SandboxState.RESUMING,
           SandboxState.SNAPSHOTTING, SandboxState.FORKING)
#: Every state a sandbox this node holds can be in (the roster).
HELD = (*RUNNING, SandboxState.PAUSING, SandboxState.PAUSED, SandboxState.KILLING)


def node_id_of(node: Node) -> str:
    return node_id(node.settings)


def advertised(node: Node) -> str:
    if node.settings.advertise:
        return node.settings.advertise.rstrip("/")
    host, _, port = node.settings.listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        raise InvalidArgument(f"listen {node.settings.listen!r} is every address: set "
                              "AENV_ADVERTISE to the URL other cluster members reach this "
                              "node at")
    return f"http://{host}:{port}"


class Heartbeat:
    """The heartbeat loop of one node (``start``/``close``). The node's ``draining`` (set by
    ``ops/drain.py``) is its word to the schedulers."""

    def __init__(self, node: Node, redis: Redis, keys: Keys | None = None) -> None:
        self.node = node
        self.redis = redis
        self.keys = keys or Keys()
        self.node_id = node_id_of(node)
        self.address = advertised(node)
        self._cpu = CpuMeter()

    async def measure(self) -> tuple[NodeInfo, list[str], dict[str, Usage]]:
        """The node's heartbeat, its roster, and what each team holds on it."""
        records = await self.node.store.list(HELD)
        running = sum(r.state in RUNNING for r in records)
        used, total = memory()
        templates = [t.template_id for t in await self.node.template_store.list_templates()]
        default = self.node.settings.default_template
        info = NodeInfo(
            node_id=self.node_id, address=self.address,
            state="draining" if self.node.drain.on else "ready",
            limit=self.node.settings.max_sandboxes,
            starting_limit=self.node.settings.max_concurrent_starts
            + self.node.settings.max_queued_starts,
            running=running,
            starting=self.node.admission.running + self.node.admission.waiting,
            cpu_pct=self._cpu.percent(), memory_used=used, memory_total=total,
            host_key=requirements_key(self.node.host_requirements)
            if self.node.host_requirements else "",
            templates=sorted({default, *templates}),
            warm={default: self.node.warm.ready},
            volumes=self.node.volumes.held_names(),
        )
        usage = usage_by_team(records, self.node.tenancy.default_team_id)
        return info, [r.sandbox_id for r in records], usage

    async def beat(self) -> None:
        measured = await registry.now_ms(self.redis)
        info, roster, usage = await self.measure()
        await registry.heartbeat(self.redis, self.keys, info, roster, measured)
        shared = self.node.quotas.shared
        if shared is not None:
            await shared.publish_all(usage, measured)

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.beat()
                if failing:
                    log.info("cluster heartbeats reach %s again", self.keys.prefix)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down or failing over: keep serving, retry
                if not failing:
                    log.warning("cluster heartbeat failed (retrying every %.1f s): %s",
                                self.node.settings.heartbeat_interval_s, exc)
                failing = True
            await asyncio.sleep(self.node.settings.heartbeat_interval_s)

    def start(self) -> None:
        self.node.supervisor.spawn("cluster-heartbeat", self._run)

    async def close(self) -> None:
        """After the supervisor stopped the heartbeat."""
        await self.redis.aclose()
