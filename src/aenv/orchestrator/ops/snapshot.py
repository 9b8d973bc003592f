"""Persistent snapshots: save a running sandbox's memory (files included: the root's writable
layer lives in sandbox memory) into the repository, as a template new sandboxes restore from.

The source keeps running: the checkpoint pauses it only while it is written
(``--leave-running``). Connections into the sandbox are closed first (``quiesce.py``): a
client's open command stream ends and can re-attach to the process, which lives on.

Prerequisites: the sandbox is running. On success: the snapshot can be used at once on this
node (``templateID`` for create, ``GET /snapshots``: they wait for its commit), and on every
node once committed; the source is ``running`` again.
The source is ``running`` again as soon as its image is on this node's disk. The answer
comes once the commit's order is written beside the staged image; the commit to the
repository (blobs, then the manifest) runs after it (``storage/pending_commits.py``), and a
node killed before it ends finishes it at its next start. A node of a cluster commits before
it answers: behind a gateway the next create from the snapshot may land on any node.
On failure: nothing is visible (the staged image is removed); the source runs on.
A crash mid-snapshot leaves only a staging directory, which the repository removes at start,
and perhaps blobs without a manifest, which GC removes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from aenv.core.errors import Conflict, FailedPrecondition
from aenv.core.faults import fault
from aenv.core.ids import new_snapshot_id
from aenv.core.states import SandboxState
from aenv.orchestrator import disk_mode
from aenv.orchestrator.context import Node
from aenv.orchestrator.disk_room import ensure_room
from aenv.orchestrator.instance_codec import decode, envd_bundle_of
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.runtime.base import MemoryImage
from aenv.storage.repository import SnapshotDraft
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.snapshot")


async def create_snapshot(node: Node, sandbox_id: str, name: str | None) -> SnapshotDraft:
    await node.store.require(sandbox_id)
    return await node.owners.run(sandbox_id, "snapshot",
                                 lambda: _snapshot_owned(node, sandbox_id, name))


async def _snapshot_owned(node: Node, sandbox_id: str, name: str | None) -> SnapshotDraft:
    record = await node.store.require(sandbox_id)
    if record.state != SandboxState.RUNNING:
        raise Conflict(f"sandbox {sandbox_id} is {record.state.public}; snapshot a running one")
    record = await node.store.update(record, state=SandboxState.SNAPSHOTTING)
    return await _snapshot(node, record, name)


async def _snapshot(node: Node, record: SandboxRecord, name: str | None) -> SnapshotDraft:
    started = time.monotonic()
    staged = node.repository.stage(new_snapshot_id())
    clone = disk_mode.seed_path(node, staged.path.name) if node.workspaces else None
    try:
        try:
            if clone is not None:
                await disk_mode.checkpoint_with_disk(node, record, staged.memory_dir, clone)
            else:
                await checkpoint_running(node, record, staged.memory_dir)
        finally:
            # The image is on the node's disk: the source runs on while it is committed.
            await back_to_running(node, record)
        saved = time.monotonic()
        fault("snapshot.checkpointed")
        image_bytes = sum(f.stat().st_size for f in staged.memory_dir.iterdir())
        draft = draft_of(node, record, staged.snapshot_id, name)
        layers = node.rootfs.recorded_lowers(record.sandbox_id) or []
        bundle = envd_bundle_of(record.instance, node.envd_bundle)
        if node.settings.cluster is None:
            # The disk's chunks are read after the answer, in the commit (after any earlier
            # export of this sandbox: each reads only what changed since the one before).
            # Creates here restore onto the local clone at once.
            export = None
            if clone is not None:
                await disk_mode.keep_local(node, clone, staged.snapshot_id)
                export = disk_mode.export_order(node, record.sandbox_id, clone,
                                                staged.snapshot_id)
            exported = time.monotonic()
            snapshot = await node.repository.commit_later(
                staged, draft, layers=layers, envd_bundle=bundle, disk_export=export)
        else:
            # Behind a gateway the next create from it may be placed on any node, which
            # finds it only once committed: export and commit before the answer.
            disk = (await disk_mode.export(node, record.sandbox_id, clone, staged.snapshot_id)
                    if clone is not None else None)
            exported = time.monotonic()
            snapshot = (await node.repository.commit(
                staged, draft, layers=layers, envd_bundle=bundle, disk=disk)).manifest
    except BaseException:
        await node.repository.discard(staged)
        if clone is not None:
            clone.unlink(missing_ok=True)
            disk_mode.drop_local(node, staged.snapshot_id)
        raise
    log.info("snapshot %s of %s in %.0f ms (save %.0f ms, disk %.0f ms, %s %.0f ms, "
             "%.1f MB)", snapshot.snapshot_id, record.sandbox_id,
             (time.monotonic() - started) * 1000, (saved - started) * 1000,
             (exported - saved) * 1000,
             "commit" if node.settings.cluster else "order, exporting and committing after",
             (time.monotonic() - exported) * 1000, image_bytes / 1e6)
    return snapshot


async def checkpoint_running(node: Node, record: SandboxRecord, dest: Path) -> MemoryImage:
    """Checkpoint a running sandbox into ``dest``, leaving it running."""
    slot, instance = decode(record.instance, record.sandbox_id)
    if instance is None or slot is None:
        raise FailedPrecondition(f"sandbox {record.sandbox_id} has no runtime")
    ensure_room(node.runtime, instance, dest.parent,
                f"a memory image of sandbox {record.sandbox_id}")
    async with quiesced(node, record.sandbox_id, slot):
        return await node.runtime.checkpoint(instance, dest, leave_running=True)


def draft_of(
    node: Node, record: SandboxRecord, snapshot_id: str, name: str | None
) -> SnapshotDraft:
    return SnapshotDraft(
        snapshot_id=snapshot_id,
        names=[name] if name else [],
        source_sandbox_id=record.sandbox_id,
        template_id=record.template_id,
        created_at=node.clock(),
        requirements=node.host_requirements,
        cpu_count=record.cpu_count,
        memory_mb=record.memory_mb,
        env_vars=record.env_vars,
        metadata=record.metadata,
        envd_token=record.envd_token,
        volume_mounts=list(record.volume_mounts or ()),
        team_id=record.team_id,
    )


async def back_to_running(node: Node, record: SandboxRecord) -> None:
    current = await node.store.get(record.sandbox_id)
    if current is not None and current.state in (SandboxState.SNAPSHOTTING,
                                                  SandboxState.FORKING):
        await node.store.update(current, state=SandboxState.RUNNING)
