"""Pause a sandbox in two tiers: freeze at once, write its memory to disk soon after.

*Pause* (the API call) stops every task of the sandbox (~25 ms) and answers: the record is
``paused`` with its runtime frozen and its slot held, so a resume within ``pause_hot_s`` is a
thaw (milliseconds). A frozen sandbox does not depend on the server process, so an
acknowledged pause survives a server crash; recovery finds it frozen and carries on.

*Spill* (background, see ``orchestrator/spill.py``) writes a frozen sandbox's memory image to
``<paused_dir>/<id>`` (checkpoint; the sandbox exits), then frees its runtime and slot: a
paused sandbox then costs its image on disk and no memory. The image is written to
``<id>.partial`` and renamed when complete, so a crash never leaves a half image that looks
whole; the record names the image only once it is renamed.

Prerequisites: ``pause``: the sandbox is running. ``spill``: it is paused and frozen.
On failure: ``pause`` leaves it running (``Conflict`` 409 if already paused or busy);
``spill`` leaves it frozen (and paused) and raises.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from aenv.core.errors import Conflict, FailedPrecondition, InDoubt
from aenv.core.faults import fault
from aenv.core.states import SandboxState
from aenv.orchestrator import disk_mode, paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.disk_room import ensure_room
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.instance_codec import decode, frozen, paused_image
from aenv.orchestrator.ops import fs_pause
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.orchestrator.team_quota import team_changed
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.pause")

_PAUSED = {SandboxState.PAUSED, SandboxState.PAUSING}


async def pause(node: Node, sandbox_id: str, *, require_healthy: bool = False,
                memory: bool = True, unless: Callable[[], bool] | None = None,
                wait: float | None = None) -> SandboxRecord:
    """``require_healthy`` (E2B ``requireHealthyGuest``): refuse (409) when envd does not
    answer, instead of pausing a guest that may be wedged; otherwise such a pause goes ahead
    and the record says ``envd_unresponsive`` (shown as ``envdUnresponsiveAtPause``).
    ``memory=False`` on a node with disk workspaces keeps only the files (``fs_pause.py``);
    elsewhere the files live in memory, so the pause keeps both. ``unless`` is asked once
    the sandbox is owned: true gives it back running (``Conflict``) — the idle pause's last
    look for traffic that arrived while the record was read. ``wait``: how long to wait for
    the sandbox's turn (0: background work, skipped while another operation holds it)."""
    paused = await node.owners.run(
        sandbox_id, "pause",
        lambda: _pause(node, sandbox_id, require_healthy, memory, unless), wait=wait)
    await team_changed(node, paused.team_id)  # its memory no longer counts, cluster-wide
    return paused


async def _pause(node: Node, sandbox_id: str, require_healthy: bool, memory: bool,
                 unless: Callable[[], bool] | None) -> SandboxRecord:
    record = await node.store.require(sandbox_id)
    if record.state in _PAUSED:
        raise Conflict(f"sandbox {sandbox_id} is already paused")
    if record.state != SandboxState.RUNNING:
        raise Conflict(f"sandbox {sandbox_id} is {record.state}; try again")
    if unless is not None and unless():
        raise Conflict(f"sandbox {sandbox_id} is in use; not paused")
    # Owned before the guest is asked: a snapshot or fork that won the sandbox freezes it,
    # and a health request of ours still in flight into the frozen guest stalls that freeze
    # (measured with disk workspaces: the control socket's Pause unanswered for 10 s).
    record = await node.store.update(record, state=SandboxState.PAUSING)
    try:
        healthy = await _guest_answers(node, record)
    except BaseException:
        await _back_to(node, record, SandboxState.RUNNING)
        raise
    if not healthy and require_healthy:
        await _back_to(node, record, SandboxState.RUNNING)
        raise Conflict(f"sandbox {record.sandbox_id}: envd does not answer, so it was not "
                       "paused (requireHealthyGuest)")
    if not memory and disk_mode.on_disk(node):
        return await fs_pause.pause_files(node, record)
    if not healthy:
        log.warning("pausing %s although its envd does not answer", record.sandbox_id)
        record = await node.store.update(
            record, instance={**(record.instance or {}), "envd_unresponsive": True})
    return await _freeze(node, record)


async def _back_to(node: Node, record: SandboxRecord, state: SandboxState) -> None:
    """Give the sandbox back in ``state`` from the transitional one it is in now (the
    latest record: another field may have been written meanwhile). A kill that preempted
    the operation has written ``killing``: then nothing is given back."""
    current = await node.store.get(record.sandbox_id)
    if current is not None and current.state == record.state:
        await node.store.update(current, state=state)


async def _guest_answers(node: Node, record: SandboxRecord) -> bool:
    slot, _ = decode(record.instance, record.sandbox_id)
    if slot is None:
        return False
    async with EnvdClient(node.guests.transport(slot), slot) as envd:
        return await envd.healthy()


async def _freeze(node: Node, record: SandboxRecord) -> SandboxRecord:
    slot, instance = decode(record.instance, record.sandbox_id)
    try:
        if instance is None or slot is None:
            raise FailedPrecondition(f"sandbox {record.sandbox_id} has no runtime to pause")
        # Open streams would hang on a frozen guest, and the memory written out later must
        # hold no connected endpoint: close them all now.
        async with quiesced(node, record.sandbox_id, slot):
            await node.runtime.freeze(instance)
    except InDoubt:
        # Paused or not, nobody can tell; a resume of one that runs would kill it. Writing it
        # to disk settles it either way, so the pause stands and the spill starts now.
        log.warning("the freeze of %s is in doubt: writing it to disk", record.sandbox_id)
        return await _frozen(node, record, spill_in=0.0)
    except BaseException:
        await _back_to(node, record, SandboxState.RUNNING)
        raise
    return await _frozen(node, record, spill_in=None)


async def _frozen(node: Node, record: SandboxRecord, *, spill_in: float | None
                  ) -> SandboxRecord:
    record = await node.store.update(
        record, state=SandboxState.PAUSED, instance={**(record.instance or {}), "frozen": True}
    )
    node.spiller.schedule(record.sandbox_id, delay=spill_in)
    return record


def image_dir(node: Node, sandbox_id: str) -> Path:
    return node.paused_dir / sandbox_id


async def spill(node: Node, sandbox_id: str, *, wait: float = 0.0) -> SandboxRecord | None:
    """Write a frozen sandbox's memory to disk and free it. None if there is nothing to do
    (not paused, already on disk, or gone). ``Conflict`` while another operation holds the
    sandbox (``wait``: how long to wait for its turn)."""
    record = await node.owners.run(sandbox_id, "spill", lambda: _spill_owned(node, sandbox_id),
                                   wait=wait)
    if record is None:
        return None
    # Durable here first, then in the repository for any node to resume (a failure there
    # leaves it paused on this node only). Outside the turn: a resume need not wait for the
    # repository, and a resume or kill that overtakes the publish makes it stand down.
    return await paused_repo.publish_or_keep(node, record)


async def _spill_owned(node: Node, sandbox_id: str) -> SandboxRecord | None:
    record = await node.store.get(sandbox_id)
    if record is None or record.state != SandboxState.PAUSED or not frozen(record.instance):
        return None
    record = await node.store.update(record, state=SandboxState.PAUSING)
    return await _spill(node, record)


async def _spill(node: Node, record: SandboxRecord) -> SandboxRecord:
    sid = record.sandbox_id
    slot, instance = decode(record.instance, sid)
    final = image_dir(node, sid)
    partial = final.with_name(final.name + ".partial")
    started = time.monotonic()
    try:
        if instance is None or slot is None:
            raise FailedPrecondition(f"sandbox {sid} has no runtime to write out")
        await asyncio.to_thread(shutil.rmtree, partial, True)
        await asyncio.to_thread(shutil.rmtree, final, True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        ensure_room(node.runtime, instance, partial.parent, f"writing sandbox {sid} to disk")
        image = await node.runtime.checkpoint(instance, partial, leave_running=False)
        fault("spill.checkpointed")
        await asyncio.to_thread(_seal, partial, final)
        fault("spill.sealed")
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, partial, True)
        await _back_to(node, record, SandboxState.PAUSED)
        raise
    # Free the runtime and slot *before* the record says "on disk": a resume that starts
    # once it does must not meet the old container under the same runtime id. A crash in
    # between leaves a pausing record whose image is complete: recovery finishes the job.
    try:
        await node.runtime.destroy(instance)
    except BaseException:
        # Still frozen and whole: stay the hot kind of paused; the spill is tried again.
        await asyncio.to_thread(shutil.rmtree, final, True)
        await _back_to(node, record, SandboxState.PAUSED)
        raise
    fault("spill.destroyed")
    await node.guests.forget(slot)
    await node.pool.release(slot)
    data = {k: v for k, v in (record.instance or {}).items()
            if k in ("envd_bundle", "envd_unresponsive")}
    record = await node.store.require(sid)
    record = await node.store.update(
        record, state=SandboxState.PAUSED, instance={**data, "image": str(final)}
    )
    log.info("paused %s to disk in %.0f ms (%.1f MB)", sid,
             (time.monotonic() - started) * 1000, image.size_bytes / 1e6)
    return record


def _seal(partial: Path, final: Path) -> None:
    """fsync the image's files and rename it into place (atomic commit)."""
    for name in os.listdir(partial):
        fd = os.open(partial / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    partial.rename(final)
    fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def on_disk(record: SandboxRecord) -> Path | None:
    return paused_image(record.instance)
