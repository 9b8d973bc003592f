"""Resume a paused sandbox (connect, ``/resume``, auto-resume on proxy traffic).

A frozen sandbox is thawed (milliseconds); one paused to disk is restored from its memory
image into a fresh network slot (same guest address), under the same id, with the same envd
(and so the same access token, processes and files). The image is deleted once the sandbox
runs again. With memory workspaces the restore goes into a pre-created sandbox of the same
shape when one is ready (``orchestrator/precreated.py``: ~95 instead of ~180 ms).

Prerequisites: the sandbox exists. If another operation holds it (a pause being written to
disk, a snapshot), the resume waits for it (``transition_wait_s``).
On success: ``(record, resumed)``; a running sandbox only gets ``end = max(end, now+timeout)``
and ``resumed`` is false; a resumed one gets ``end = now + timeout``.
On failure: ``NotFound``; ``Conflict`` when it stays busy; a failed restore leaves it paused
with its image (and raises ``RuntimeFailure``/``Unavailable``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

from aenv.core.errors import (
    AenvError,
    Conflict,
    FailedPrecondition,
    InDoubt,
    NotFound,
    Unavailable,
)
from aenv.core.net import EgressPolicy, NetSlot
from aenv.core.states import SandboxState
from aenv.core.unwind import to_the_end
from aenv.orchestrator import paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import policy_of
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.instance_codec import (
    decode,
    envd_bundle_of,
    frozen,
    instance_json,
    paused_image,
    ready_to_resume,
    slot_to_json,
)
from aenv.orchestrator.ops import fs_pause
from aenv.orchestrator.ops.boot import Laps, acquire_slot, release
from aenv.orchestrator.ops.lifetime import set_timeout
from aenv.orchestrator.ops.teardown import teardown
from aenv.orchestrator.precreated import Precreated, shape
from aenv.orchestrator.resume_ready import READY_KEYS, paused_spec
from aenv.orchestrator.team_quota import team_starts
from aenv.orchestrator.volumes import mounts_of
from aenv.runtime.base import Instance, MemoryImage
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.resume")

async def resume(
    node: Node, sandbox_id: str, timeout_s: int | None
) -> tuple[SandboxRecord, bool]:
    seconds = node.settings.default_timeout_s if timeout_s is None else timeout_s
    record = await node.store.get(sandbox_id)
    if record is None:
        # Paused by another node sharing the repository?
        if await paused_repo.adopt(node, sandbox_id) is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
    elif record.state == SandboxState.RUNNING and not node.owners.busy(sandbox_id):
        # Only the end time changes: no turn needed (``set_end_at`` races nothing).
        return await set_timeout(node, sandbox_id, seconds, allow_shorter=False), False
    return await node.owners.run(sandbox_id, "resume",
                                 lambda: _resume_owned(node, sandbox_id, seconds))


async def _resume_owned(node: Node, sandbox_id: str, seconds: int
                        ) -> tuple[SandboxRecord, bool]:
    record = await node.store.require(sandbox_id)
    if record.state == SandboxState.RUNNING:
        return await set_timeout(node, sandbox_id, seconds, allow_shorter=False), False
    if record.state == SandboxState.KILLING:
        raise NotFound(f"sandbox {sandbox_id} not found")
    if record.state != SandboxState.PAUSED:
        raise Conflict(f"sandbox {sandbox_id} is {record.state}; try again")
    if node.workspaces is not None and not frozen(record.instance):
        # A thaw needs no new disk; a restore or reboot may (the host's watermark: 429).
        await node.workspaces.ensure_host_room(f"resuming sandbox {sandbox_id}")
    async with team_starts(node, record.team_id, count=1, memory_mb=record.memory_mb):
        record = await node.store.update(record, state=SandboxState.RESUMING)
        node.spiller.cancel(sandbox_id)
        return await _resume(node, record, seconds), True


async def _to_paused(node: Node, record: SandboxRecord, **changes: object) -> None:
    """Give a resume that failed back as paused (unless a kill took the sandbox meanwhile)."""
    current = await node.store.get(record.sandbox_id)
    if current is not None and current.state == SandboxState.RESUMING:
        await node.store.update(current, state=SandboxState.PAUSED, **changes)


async def _resume(node: Node, record: SandboxRecord, seconds: int) -> SandboxRecord:
    started = time.monotonic()
    if frozen(record.instance):
        _, instance = decode(record.instance, record.sandbox_id)
        try:
            if instance is None:
                raise FailedPrecondition(f"sandbox {record.sandbox_id} has no runtime")
            await node.runtime.thaw(instance)
        except InDoubt as exc:
            # Whether it runs is unknown, and a second resume could kill it: write it to disk
            # (right either way); a resume after that restores it.
            await _to_paused(node, record)
            node.spiller.schedule(record.sandbox_id, delay=0.0)
            raise Unavailable(f"sandbox {record.sandbox_id} is being written to disk after a "
                              "resume that got no answer; try again in a few seconds") from exc
        except BaseException:
            await _to_paused(node, record)
            raise
        data = {k: v for k, v in (record.instance or {}).items() if k != "frozen"}
        consumed = None
        how = "thawed"
        phases: dict[str, float] = {}
    elif fs_pause.filesystem_only(record):
        record, data = await fs_pause.reboot(node, record)
        consumed = None
        how = "rebooted on its files"
        phases = {}
    else:
        lap = Laps()
        if await paused_repo.moved_away(node, record):
            await node.store.update(record, state=SandboxState.KILLING)
            await teardown(node, record)
            await node.store.delete(await node.store.require(record.sandbox_id))
            raise NotFound(f"sandbox {record.sandbox_id} was resumed on another node")
        lap("repository")
        with node.precreated.busy():
            record, data = await _restore(node, record, lap)
        phases = lap.phases
        consumed = paused_image(record.instance)
        how = "restored"
    now = node.clock()
    try:
        record = await node.store.update(
            await node.store.require(record.sandbox_id), state=SandboxState.RUNNING,
            instance=data, end_at=now + seconds)
    except BaseException:
        if how != "thawed":
            # The new runtime and slot are only in ``data``: a kill that took the record
            # meanwhile tears down what the record names, so release them here.
            slot, instance = decode(data, record.sandbox_id)
            await to_the_end(_undo(node, record, slot, instance))
        raise
    if consumed is not None:
        # The record no longer names it: a crash before this line leaves a stray image
        # that recovery deletes (and a stray manifest, which the next pause replaces).
        await asyncio.to_thread(shutil.rmtree, consumed, True)
        try:
            await paused_repo.unpublish(node, record.sandbox_id)
        except AenvError as exc:
            log.warning("resumed %s, but could not remove its paused manifest: %s",
                        record.sandbox_id, exc.message)
    if phases:
        lap("finish")
    log.info("resumed %s (%s) in %.0f ms%s", record.sandbox_id, how,
             (time.monotonic() - started) * 1000,
             ": " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()) if phases else "")
    return record


async def _restore(
    node: Node, record: SandboxRecord, lap: Laps
) -> tuple[SandboxRecord, dict[str, object]]:
    sid = record.sandbox_id
    image_path = paused_image(record.instance)
    if image_path is None:
        await _to_paused(node, record)
        raise FailedPrecondition(f"paused sandbox {sid} has no memory image")
    bundle = envd_bundle_of(record.instance, node.envd_bundle)
    policy = policy_of(record)
    slot: NetSlot | None = None
    instance: Instance | None = None
    try:
        image = MemoryImage.at(image_path)
        if ready_to_resume(record.instance):
            # Made ahead on its own files, in its own slot (``resume_ready.py``).
            node.resume_ready.forget(sid)
            slot, ready = decode(record.instance, sid)
            assert slot is not None and ready is not None
            lap("ready")
            instance = await node.runtime.restore_precreated(ready, image)
        else:
            if record.volume_mounts:
                # Its volumes here (a sandbox paused on another node is resumed on this one).
                await node.volumes.adopt(sid, mounts_of(record.volume_mounts))
            pre = None if record.volume_mounts else await _adopt_precreated(node, record, bundle)
            if pre is not None:
                slot, instance = pre.slot, replace(pre.instance, sandbox_id=sid)
                lap("precreated")
            else:
                slot = await acquire_slot(node, policy)
                lap("slot")
            # The slot is in the record before it is used, so recovery can release it.
            record = await node.store.update(
                record, instance={**(record.instance or {}), "slot": slot_to_json(slot)})
            lap("record")
            if pre is not None:
                if policy != EgressPolicy():
                    await node.pool.set_egress(slot, policy)
                instance = None  # destroyed by a failed restore
                instance = await node.runtime.restore_precreated(pre.instance, image,
                                                                 sandbox_id=sid)
            else:
                rootfs = await node.rootfs.ensure_mounted(sid)
                lap("rootfs")
                instance = await node.runtime.restore(image, paused_spec(node, record, rootfs),
                                                      slot)
        lap("restore")
        async with EnvdClient(node.guests.transport(slot), slot) as envd:
            await envd.wait_ready(node.settings.envd_ready_timeout_s, restored=True)
        lap("envd_ready")
    except BaseException:
        await to_the_end(_undo(node, record, slot, instance))
        raise
    return record, instance_json(slot, instance, envd_bundle=bundle)


async def _adopt_precreated(node: Node, record: SandboxRecord, bundle: Path
                            ) -> Precreated | None:
    """A pre-created sandbox of ``record``'s shape whose directory is now the sandbox's
    (rootfs included), or None: none ready, disk workspaces, or the sandbox's directory cannot
    be taken over (then the pre-created one is given back to nothing: destroyed)."""
    if node.workspaces is not None:
        return None
    lowers = node.rootfs.recorded_lowers(record.sandbox_id)
    if lowers is None:
        return None
    node.precreated.expect()
    pre = node.precreated.take_shape(
        shape(lowers, bundle, record.cpu_count, record.memory_mb, disk_image=None))
    if pre is None:
        return None
    try:
        await node.rootfs.adopt(record.sandbox_id, pre.sandbox_id)
    except BaseException as exc:
        await to_the_end(release(node, pre.sandbox_id, pre.slot, pre.instance))
        if isinstance(exc, Conflict):
            log.warning("resuming %s afresh: %s", record.sandbox_id, exc.message)
            return None
        raise
    return pre


async def _undo(
    node: Node, record: SandboxRecord, slot: NetSlot | None, instance: Instance | None
) -> None:
    try:
        if instance is not None:
            await node.runtime.destroy(instance)
        if slot is not None:
            await node.guests.forget(slot)
            await node.pool.release(slot)
        current = await node.store.get(record.sandbox_id)
        data = {k: v for k, v in ((current or record).instance or {}).items()
                if k not in READY_KEYS}
        await _to_paused(node, record, instance=data)
    except Exception:
        log.exception("could not roll back the failed resume of %s; recovery will",
                      record.sandbox_id)
