"""Crash recovery: make the store and the machine agree again after a restart.

Two phases (STYLE §14): *observe* what the runtime has, then *plan* with a pure function, then
*apply*. A record whose sandbox is alive is re-attached; a half-created or half-killed sandbox
is torn down; a runtime sandbox no record knows is destroyed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import policy_from
from aenv.orchestrator.instance_codec import decode
from aenv.orchestrator.ops.teardown import teardown
from aenv.runtime.base import Instance, Observed
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.recover")


@dataclass
class Plan:
    reattach: list[SandboxRecord] = field(default_factory=list)
    teardown: list[SandboxRecord] = field(default_factory=list)
    orphans: list[Observed] = field(default_factory=list)


def plan(records: list[SandboxRecord], observed: list[Observed]) -> Plan:
    alive = {o.sandbox_id: o for o in observed if o.status in ("running", "created", "paused")}
    result = Plan()
    known = set()
    for record in records:
        known.add(record.sandbox_id)
        if record.state == SandboxState.RUNNING and record.sandbox_id in alive:
            result.reattach.append(record)
        elif record.state == SandboxState.PAUSED:
            continue  # nothing runs; its state is on disk
        else:
            result.teardown.append(record)
    result.orphans = [o for o in observed if o.sandbox_id not in known]
    return result


async def recover(node: Node) -> Plan:
    records = await node.store.list()
    observed = await node.runtime.observe()
    todo = plan(records, observed)
    for record in todo.reattach:
        slot, _ = decode(record.instance, record.sandbox_id)
        if slot is not None:
            await node.pool.adopt(slot, policy_from(record.allow_internet_access, record.network))
        await node.rootfs.ensure_mounted(record.sandbox_id)
        log.info("re-attached sandbox %s", record.sandbox_id)
    for record in todo.teardown:
        log.info("tearing down sandbox %s left %s by a previous run", record.sandbox_id,
                 record.state)
        try:
            if record.state != SandboxState.KILLING:
                record = await node.store.update(record, state=SandboxState.KILLING)
            await teardown(node, record)
            await node.store.delete(record)
        except Exception:
            log.exception("could not tear down %s", record.sandbox_id)
    known = {r.sandbox_id for r in todo.reattach}
    for sandbox_id in node.rootfs.sandbox_ids():
        if sandbox_id not in known and await node.store.get(sandbox_id) is None:
            # A warm sandbox or a create that never got its record: nothing refers to it.
            orphan_instance = next((o for o in todo.orphans if o.sandbox_id == sandbox_id), None)
            if orphan_instance is not None:
                await node.runtime.destroy(
                    Instance(sandbox_id, orphan_instance.runtime_id, orphan_instance.pid, None)
                )
            await node.rootfs.disassemble(sandbox_id, keep_upper=False)
    for orphan in todo.orphans:
        log.info("destroying orphan runtime sandbox %s", orphan.runtime_id)
        slot_less = Instance(orphan.sandbox_id, orphan.runtime_id, orphan.pid, None)
        await node.runtime.destroy(slot_less)
    return todo
