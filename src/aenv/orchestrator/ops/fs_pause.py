"""Filesystem-only pause (E2B ``memory: false``) and its resume, on disk workspaces.

*Pause*: connections are closed, the sandbox's runtime is destroyed (its processes and
memory go), its rootfs unmounted and its disk image detached; the record is ``paused`` with
``"filesystem": true`` and holds no slot, runtime or memory. The files stay in the disk image.

*Resume*: the disk image is attached and the rootfs mounted again, a fresh runtime boots on it
(a new boot: new boot id, no processes but envd's), envd is handed the sandbox's own token,
env vars, user and working directory, and the record is ``running`` again.

Only on nodes with ``workspace = "disk"``: with the files in sandbox memory there is nothing
to keep without the memory, so there ``memory: false`` is a full pause (``pauseMode: full``).

Prerequisites: ``pause_files``: the sandbox is ``pausing`` (the caller moved it there);
``reboot``: it is ``resuming`` and was paused by ``pause_files``.
On failure: ``pause_files`` leaves it running if the runtime was not yet destroyed, else
paused filesystem-only; ``reboot`` leaves it paused (nothing of the new boot is kept).
A crash in between leaves a record recovery settles: pausing with no runtime and a kept upper →
torn down by the plan's rules unless marked ``filesystem`` (see recover.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from aenv.core.net import NetSlot
from aenv.core.states import SandboxState
from aenv.core.unwind import to_the_end
from aenv.orchestrator import egress_trust
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import policy_of
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.instance_codec import decode, envd_bundle_of, instance_json
from aenv.orchestrator.ops.boot import acquire_slot, sandbox_spec
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.orchestrator.volumes import mounts_of, slot_binds
from aenv.runtime.base import Instance
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.fs_pause")


def filesystem_only(record: SandboxRecord) -> bool:
    return bool(record.instance and record.instance.get("filesystem"))


async def pause_files(node: Node, record: SandboxRecord) -> SandboxRecord:
    sid = record.sandbox_id
    slot, instance = decode(record.instance, sid)
    bundle = envd_bundle_of(record.instance, node.envd_bundle)
    # Marked first: a crash after the destroy then leaves a record recovery keeps as paused.
    record = await node.store.update(
        record, instance={**(record.instance or {}), "filesystem": True})
    if instance is not None and slot is not None:
        try:
            async with quiesced(node, sid, slot):
                await node.runtime.destroy(instance)
        except BaseException:
            data = {k: v for k, v in (record.instance or {}).items() if k != "filesystem"}
            await node.store.update(record, state=SandboxState.RUNNING, instance=data)
            raise
    # From here the processes are gone: whatever fails, the sandbox is paused with its files.
    record = await node.store.update(
        record, state=SandboxState.PAUSED,
        instance={"filesystem": True, "envd_bundle": str(bundle)})
    if slot is not None:
        await node.guests.forget(slot)
        await node.pool.release(slot)
    await node.rootfs.disassemble(sid, keep_upper=True)
    log.info("paused %s, files only", sid)
    return record


async def reboot(node: Node, record: SandboxRecord) -> tuple[SandboxRecord, dict[str, object]]:
    """Boot the sandbox fresh on its kept files; the new instance JSON."""
    started = time.monotonic()
    sid = record.sandbox_id
    bundle = envd_bundle_of(record.instance, node.envd_bundle)
    template = await node.templates.resolve(record.template_id)
    slot: NetSlot | None = None
    instance: Instance | None = None
    try:
        slot = await acquire_slot(node, policy_of(record))
        record = await node.store.update(
            record, instance={**(record.instance or {}), "slot": instance_json(slot, None)["slot"]})
        rootfs = await node.rootfs.ensure_mounted(sid)
        if record.volume_mounts:
            await node.volumes.adopt(sid, mounts_of(record.volume_mounts))
        spec = replace(
            sandbox_spec(sid, rootfs, bundle, template, record.cpu_count, record.memory_mb),
            volumes=node.volumes.binds(sid, mounts_of(record.volume_mounts)))
        instance = await node.runtime.boot(spec, slot)
        async with EnvdClient(node.guests.transport(slot), slot) as envd:
            await envd.wait_ready(node.settings.envd_ready_timeout_s)
            await envd.init(token=record.envd_token, env_vars=record.env_vars,
                            user=template.default_user, workdir=template.default_workdir,
                            current_token=None, renew_boot_id=False,
                            volume_mounts=slot_binds(bundle, mounts_of(record.volume_mounts)),
                            trust_certificates=egress_trust.certificates(node, record.network))
    except BaseException:
        await to_the_end(_undo(node, record, slot, instance))
        raise
    log.info("rebooted %s on its files in %.0f ms", sid, (time.monotonic() - started) * 1000)
    return record, instance_json(slot, instance, envd_bundle=bundle)


async def _undo(node: Node, record: SandboxRecord, slot: NetSlot | None,
                instance: Instance | None) -> None:
    try:
        if instance is not None:
            await node.runtime.destroy(instance)
        await node.rootfs.disassemble(record.sandbox_id, keep_upper=True)
        if slot is not None:
            await node.guests.forget(slot)
            await node.pool.release(slot)
    finally:
        current = await node.store.get(record.sandbox_id)
        if current is not None:
            await node.store.update(
                current, state=SandboxState.PAUSED,
                instance={k: v for k, v in (current.instance or {}).items() if k != "slot"})
