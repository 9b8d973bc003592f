"""Release everything a sandbox holds: runtime, rootfs, network slot, paused memory image.
Idempotent.

Used by kill, failed creates and recovery; each step tolerates "already gone".
"""

from __future__ import annotations

import asyncio
import logging
import shutil

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
    if node.spiller is not None:
        node.spiller.cancel(record.sandbox_id)
    image = node.paused_dir / record.sandbox_id
    for path in (image, image.with_name(image.name + ".partial")):
        await asyncio.to_thread(shutil.rmtree, path, True)
