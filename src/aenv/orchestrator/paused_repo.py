"""Paused sandboxes in the repository, so that any node sharing it can resume them.

A sandbox paused to disk (``ops/pause.py``'s spill) is first made durable on this node
(``<paused_dir>/<id>``), then **published**: committed to the repository as a ``paused``
manifest, ``paused-<sandbox id>``, that names its memory image, layers and envd bundle by digest
and carries the record a resume needs (id, access token, metadata, limits, lifecycle flags).
The record then says ``"published": true``. The image files are shared by hard link with the
blob cache, so publishing costs no second copy on a posix repository on this disk.

Resume on this node restores from the local image, as before. Resume on another node finds no
record, looks the manifest up (:func:`adopt`), fetches what it lacks, inserts the record as
paused there and resumes it. A resume anywhere deletes the manifest once the sandbox runs (it
is no longer paused); so is a kill. A node whose record is published but whose manifest has gone
knows another node took the sandbox over: it drops its own copy (:func:`moved_away`).

Prerequisites: one node resumes a given sandbox at a time (the cluster scheduler routes a
sandbox's calls to one node; two nodes racing to resume one sandbox is not prevented here).
On failure: a publish that fails (repository down) leaves the sandbox paused on this node
only, logged; :func:`publish_pending` tries again at the next start.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

from aenv.core.errors import AenvError, Conflict, FailedPrecondition, NotFound
from aenv.core.states import SandboxState
from aenv.orchestrator import disk_mode, restore_match
from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import envd_bundle_of, paused_image
from aenv.storage.repository import Snapshot, SnapshotDraft
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.paused_repo")

#: Record fields that belong to the node that runs the sandbox, not to the sandbox.
_LOCAL_FIELDS = {"state", "version", "instance", "state_changed_at", "last_error"}


def paused_id(sandbox_id: str) -> str:
    return f"paused-{sandbox_id}"


def published(record: SandboxRecord) -> bool:
    return bool(record.instance and record.instance.get("published"))


async def publish(node: Node, record: SandboxRecord) -> SandboxRecord:
    """Commit the on-disk paused sandbox ``record`` to the repository; the updated record.

    Prerequisites: ``record`` is paused with a complete local image and no runtime.
    On failure: the repository's error; the record is unchanged (still paused locally).
    """
    image = paused_image(record.instance)
    if image is None:
        raise NotFound(f"sandbox {record.sandbox_id} has no memory image to publish")
    sid = record.sandbox_id
    snapshot_id = paused_id(sid)
    existing = await node.repository.lookup(snapshot_id)
    if existing is not None and existing.manifest.kind == "paused":
        # A publish whose record update a crash cut short, or an older pause of this id.
        await node.repository.delete(snapshot_id)
    fields_ = {f.name: getattr(record, f.name) for f in fields(SandboxRecord)
               if f.name not in _LOCAL_FIELDS}
    draft = SnapshotDraft(
        snapshot_id=snapshot_id, kind="paused", source_sandbox_id=sid,
        template_id=record.template_id, created_at=node.clock(),
        requirements=node.host_requirements, cpu_count=record.cpu_count,
        memory_mb=record.memory_mb, env_vars=record.env_vars, metadata=record.metadata,
        envd_token=record.envd_token, sandbox=fields_,
    )
    staged = node.repository.stage(snapshot_id)
    clone = disk_mode.seed_path(node, staged.path.name) if node.workspaces else None
    try:
        disk = None
        if clone is not None and node.workspaces is not None:
            # Disk workspaces: the disk travels too (nothing runs: the clone is the pause).
            # Attached or not, as the pause left it: mounting it here would race a kill or
            # resume that runs meanwhile (the workspace lock orders only the clone).
            await node.workspaces.clone_frozen(sid, clone)
            disk = await disk_mode.export(node, sid, clone, snapshot_id)
        await node.repository.commit(
            staged, draft, layers=node.rootfs.recorded_lowers(sid) or [],
            envd_bundle=envd_bundle_of(record.instance, node.envd_bundle), memory_dir=image,
            disk=disk)
    except BaseException as exc:
        await asyncio.shield(node.repository.discard(staged))
        if clone is not None:
            clone.unlink(missing_ok=True)
        if isinstance(exc, FileNotFoundError):
            # A resume or kill that overtook the publish took its memory image or disk.
            raise Conflict(f"sandbox {sid} changed while it was being published: {exc}"
                           ) from exc
        raise
    try:
        # A note, not a step: the operation that may hold the sandbox now (a resume that
        # came in while this ran) must not find its own write conflicting with it.
        return await node.store.annotate(record, published=True)
    except Conflict:
        # Resumed (or killed) while it was being published: the manifest is stale already.
        await node.repository.delete(snapshot_id)
        raise


async def publish_or_keep(node: Node, record: SandboxRecord) -> SandboxRecord:
    """:func:`publish`, or the record unchanged (logged) if the repository fails."""
    try:
        return await publish(node, record)
    except AenvError as exc:
        log.warning("sandbox %s stays paused on this node only (not in the repository): %s",
                    record.sandbox_id, exc.message)
        return record


async def publish_pending(node: Node) -> int:
    """Publish every on-disk paused sandbox that is not yet (after a failed or cut-short
    publish); returns how many were published."""
    done = 0
    for record in await node.store.list(states=[SandboxState.PAUSED]):
        if paused_image(record.instance) is None or published(record):
            continue
        if published(await publish_or_keep(node, record)):
            done += 1
    return done


async def unpublish(node: Node, sandbox_id: str) -> None:
    """Remove the sandbox's paused manifest (it runs again, or is killed); idempotent."""
    snapshot = await node.repository.lookup(paused_id(sandbox_id))
    if snapshot is not None and snapshot.manifest.kind == "paused":
        try:
            await node.repository.delete(snapshot.snapshot_id)
        except NotFound:
            pass


async def unpublish_killed(node: Node, sandbox_id: str) -> None:
    """:func:`unpublish` for a sandbox whose kill is being finished, whatever its record
    said: a crash between a resume and its unpublish (or mid-kill) leaves a manifest no
    record names, and a manifest is a GC root — left, it would outlive the sandbox and
    answer a later kill, or a connect on another node, as a paused sandbox. A failure is
    logged (the sandbox is gone for its user either way)."""
    try:
        await unpublish(node, sandbox_id)
    except AenvError as exc:
        log.warning("killed %s, but could not remove its paused manifest: %s",
                    sandbox_id, exc.message)


async def moved_away(node: Node, record: SandboxRecord) -> bool:
    """True if ``record`` was published and its manifest is gone: another node resumed it."""
    if not published(record):
        return False
    return not await node.repository.committed(paused_id(record.sandbox_id))


async def adopt(node: Node, sandbox_id: str) -> SandboxRecord | None:
    """Take over a sandbox another node paused into the repository; ``None`` if there is none.

    On success: its layers, envd bundle and memory image are on this node, its rootfs is
    assembled, and its record is in this node's store as paused (on disk, published); a resume
    then restores it as any local paused sandbox.
    On failure: the repository's errors, or :class:`FailedPrecondition` if this node cannot
    restore its image; nothing is inserted.
    """
    snapshot = await node.repository.lookup(paused_id(sandbox_id))
    if snapshot is None or snapshot.manifest.kind != "paused" or not snapshot.manifest.sandbox:
        return None
    restore_match.check(snapshot.snapshot_id, snapshot.manifest.requirements,
                        node.host_requirements)
    local = await node.repository.materialize(snapshot, node.envd_bundle,
                                              disk_mode.disk_dir(node))
    if local.image is None:
        raise FailedPrecondition(f"paused sandbox {sandbox_id} has no memory image")
    image = node.paused_dir / sandbox_id
    await asyncio.to_thread(_copy_links, local.image, image)
    await node.rootfs.assemble(sandbox_id, local.layers, seed=local.disk)
    record = _record(snapshot, image, local.envd_bundle)
    if await node.store.get(sandbox_id) is None:
        await node.store.insert(record)
    log.info("adopted paused sandbox %s from the repository", sandbox_id)
    return await node.store.require(sandbox_id)


def _record(snapshot: Snapshot, image: Path, bundle: Path) -> SandboxRecord:
    data: dict[str, Any] = dict(snapshot.manifest.sandbox or {})
    known = {f.name for f in fields(SandboxRecord)} - _LOCAL_FIELDS
    values = {k: v for k, v in data.items() if k in known}
    return SandboxRecord(
        **values, state=SandboxState.PAUSED, version=1,
        instance={"image": str(image), "envd_bundle": str(bundle), "published": True},
    )


def _copy_links(source: Path, dest: Path) -> None:
    """``dest`` as hard links of the files in ``source`` (the materialized image)."""
    shutil.rmtree(dest, ignore_errors=True)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, copy_function=_link)
    partial.rename(dest)


def _link(src: str, dst: str) -> None:
    Path(dst).hardlink_to(src)
