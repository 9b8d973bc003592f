"""Release everything a sandbox holds: runtime, rootfs, network slot. Idempotent.

Used by kill, failed creates and recovery; each step tolerates "already gone".
"""

from __future__ import annotations

import logging

from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import decode
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator")


async def teardown(node: Node, record: SandboxRecord) -> None:
    slot, instance = decode(record.instance, record.sandbox_id)
    node.streams.abort(record.sandbox_id)
    if instance is not None:
        await node.runtime.destroy(instance)
    await node.rootfs.disassemble(record.sandbox_id, keep_upper=False)
    if slot is not None:
        await node.guests.forget(slot)
        await node.pool.release(slot)
