"""Disk workspaces (``workspace = "disk"``): the checkpoint that takes the disk along, the
disk's export into snapshots, and what such a node cannot do yet, in one place.

With the written files in a disk image of the sandbox's own instead of in its memory, a memory
image alone no longer holds a sandbox: it needs its disk as it was at the checkpoint instant.
:func:`checkpoint_with_disk` freezes the sandbox, clones its disk image (a reflink: no data is
copied) with the disk's filesystem frozen, checkpoints the frozen sandbox and thaws it; a fork's
children start on clones of that clone. A snapshot commits that clone as chunk blobs
(``storage/disk_chunks.py``), reading only chunks changed since the sandbox's previous
snapshot. A template's memory image is taken the same way, so its sandboxes restore onto clones
of the template's disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from pathlib import Path

from aenv.core.errors import FailedPrecondition
from aenv.core.net import NetSlot
from aenv.orchestrator import fork_seeds
from aenv.orchestrator.context import Node
from aenv.orchestrator.disk_room import ensure_room
from aenv.orchestrator.instance_codec import decode
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.runtime.base import Instance, MemoryImage
from aenv.storage.disk_exports import DiskExportOrder
from aenv.storage.manifest import DiskImage
from aenv.storage.reflink_fs import ficlone
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.disk_mode")


def on_disk(node: Node) -> bool:
    return node.settings.workspace == "disk"


def image_key(node: Node) -> tuple[str, ...]:
    """What a template image holds of this node's workspaces, for its cache key: a disk
    image has the node's disk size, which its sandboxes keep (E2B fixes it per build)."""
    return (f"disk {node.settings.disk_size_mb} MiB",) if on_disk(node) else ()


def clones_dir(node: Node) -> Path:
    """Where clones of sandboxes' disks live: on the pool's filesystem (reflinks do not cross
    filesystems), outside its top directory."""
    assert node.workspaces is not None
    return node.workspaces.pool.path / "clones"


def seed_path(node: Node, name: str) -> Path:
    """Where a clone of a sandbox's disk is kept while children are made from it."""
    directory = clones_dir(node)
    directory.mkdir(exist_ok=True)
    return directory / f"{name}.img"


async def checkpoint_with_disk(node: Node, record: SandboxRecord, dest: Path,
                               disk: Path) -> MemoryImage:
    """Checkpoint a running sandbox into ``dest`` and its disk into the clone ``disk``, both
    of one instant; the sandbox runs on.

    On failure: the sandbox runs on (thawed); neither ``dest`` nor ``disk`` is to be used.
    """
    slot, instance = decode(record.instance, record.sandbox_id)
    if instance is None or slot is None:
        raise FailedPrecondition(f"sandbox {record.sandbox_id} has no runtime")
    return await capture(node, instance, slot, dest, disk)


async def capture(node: Node, instance: Instance, slot: NetSlot, dest: Path,
                  disk: Path) -> MemoryImage:
    """:func:`checkpoint_with_disk` of a sandbox that has no record (a template's)."""
    assert node.workspaces is not None
    sid = instance.sandbox_id
    ensure_room(node.runtime, instance, dest.parent, f"a memory image of sandbox {sid}")
    steps = [time.monotonic()]
    async with quiesced(node, sid, slot):
        steps.append(time.monotonic())
        await node.runtime.freeze(instance)
        try:
            steps.append(time.monotonic())
            # While the sandbox is stopped its disk does not change: the sentry keeps no
            # dirty file data (writes reach the host at once, as the workspace spike measured)
            # and a checkpoint writes only its image. So the disk's clone (whose ext4 freeze
            # is ~35 ms of flushes) runs beside the checkpoint, not before it.
            cloning = asyncio.ensure_future(node.workspaces.clone_frozen(sid, disk))
            try:
                image = await node.runtime.checkpoint(instance, dest, leave_running=True)
            finally:
                # Never leave the clone running un-owned: it ends in tens of milliseconds.
                await asyncio.shield(asyncio.wait([cloning]))
            await cloning
            return image
        except BaseException:
            disk.unlink(missing_ok=True)
            raise
        finally:
            steps.append(time.monotonic())
            await node.runtime.thaw(instance)
            steps.append(time.monotonic())
            log.debug("capture of %s: %s ms", sid, ", ".join(
                f"{name} {(b - a) * 1000:.1f}" for name, a, b in zip(
                    ("quiesce", "freeze", "disk clone and checkpoint", "thaw"), steps,
                    steps[1:], strict=False)))


def disk_dir(node: Node) -> Path | None:
    """Where this node keeps snapshots' disk images (on the pool), or None (memory mode)."""
    return None if node.workspaces is None else node.workspaces.pool.path / "snapshots"


def _pin(node: Node, sandbox_id: str) -> Path:
    return clones_dir(node) / f"{sandbox_id}.last.img"


def _index(node: Node, sandbox_id: str) -> Path:
    return node.repository.cache.root.parent / "disks" / f"{sandbox_id}.json"


def export_order(node: Node, sandbox_id: str, clone: Path,
                 snapshot_id: str) -> DiskExportOrder:
    """The export of ``clone`` (a clone of ``sandbox_id``'s disk) into chunk blobs, reading
    only chunks changed since this sandbox's previous export (``storage/disk_exports.py``)."""
    return DiskExportOrder(clone=str(clone), index_file=str(_index(node, sandbox_id)),
                           pin=str(_pin(node, sandbox_id)), sandbox_id=sandbox_id,
                           snapshot_id=snapshot_id)


async def keep_local(node: Node, clone: Path, snapshot_id: str) -> None:
    """A clone of ``clone`` as the snapshot's disk on this node: creates here need not
    assemble it from chunks (a reflink: no data is copied)."""
    local = disk_dir(node)
    assert local is not None
    local.mkdir(exist_ok=True)
    # By a new name, then over the old: a paused sandbox is published under one id again at
    # each pause, and a crash may leave a copy the commit never followed.
    fresh = local / f".{snapshot_id}.{secrets.token_hex(4)}.img"
    try:
        await asyncio.to_thread(ficlone, clone, fresh)
        fresh.replace(local / f"{snapshot_id}.img")
    finally:
        fresh.unlink(missing_ok=True)


def drop_local(node: Node, snapshot_id: str) -> None:
    """Remove what :func:`keep_local` made for a snapshot that was not taken after all."""
    local = disk_dir(node)
    if local is not None:
        (local / f"{snapshot_id}.img").unlink(missing_ok=True)


async def export(node: Node, sandbox_id: str, clone: Path, snapshot_id: str) -> DiskImage:
    """The snapshot's disk as chunk blobs, now (after this sandbox's exports in flight);
    ``clone`` is kept as that previous export for the next one, and a clone of it as the
    snapshot's disk on this node."""
    await keep_local(node, clone, snapshot_id)
    return await node.repository.disk_exports.export_now(
        export_order(node, sandbox_id, clone, snapshot_id))


def forget(node: Node, sandbox_id: str) -> None:
    """Drop what the sandbox's snapshots kept for the next one (at its kill; after the
    exports of it still in flight)."""
    if node.workspaces is None:
        return
    node.repository.disk_exports.forget(_index(node, sandbox_id), _pin(node, sandbox_id))
    fork_seeds.forget(clones_dir(node), sandbox_id)


def drop_stale_disks(node: Node) -> int:
    """Remove local disk images of snapshots the repository no longer has, and disk clones
    a crash left (older than ``gc_grace_s``, no pending export names them); how many."""
    local = disk_dir(node)
    if local is None:
        return 0
    dropped = _drop_stale_seeds(node)
    if not local.is_dir():
        return dropped
    for path in local.glob("*.img"):
        if path.name.startswith("."):
            # Being made by export(), or left by a crash in it: only the latter is old.
            with contextlib.suppress(FileNotFoundError):
                if time.time() - path.stat().st_mtime > node.settings.gc_grace_s:
                    path.unlink()
                    dropped += 1
        elif node.repository.get(path.stem) is None and not node.repository.pending(path.stem):
            path.unlink(missing_ok=True)
            dropped += 1
    return dropped


def _drop_stale_seeds(node: Node) -> int:
    """Clones of a disk (:func:`seed_path`) live for one snapshot, fork or pause, or until
    their snapshot's export after the answer; one older than ``gc_grace_s`` that no pending
    export names was left by a crash. Pins (``<id>.last.img``) go with their sandbox, and
    so do the seeds kept for a parent's next fork (``fork_seeds``), whatever their age."""
    assert node.workspaces is not None
    directory = clones_dir(node)
    wanted = node.repository.pending_clones()
    dropped = 0
    for path in directory.glob("*.img"):
        if path.name.endswith(".last.img") or str(path) in wanted:
            continue
        parent = fork_seeds.parent_of(path)
        if parent is not None and node.workspaces.image_path(parent).exists():
            continue  # kept for the next fork of a parent that still has its disk
        with contextlib.suppress(FileNotFoundError):
            if time.time() - path.stat().st_mtime > node.settings.gc_grace_s:
                path.unlink()
                log.info("removed %s, a disk clone a crash left", path.name)
                dropped += 1
    return dropped
