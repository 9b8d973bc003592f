"""Give a template a memory image, so its sandboxes are restored instead of booted.

Once per (template layers, envd bundle): boot a sandbox of the template, wait for envd,
checkpoint it (the sandbox exits) and commit the image to the repository as a ``template``
snapshot. Later starts find it there. A restore skips envd's start-up (~1.5 s of Python
imports through the gofer) and starts with warm caches. With disk workspaces the image holds
the template sandbox's disk of the same instant (:func:`capture`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from aenv.core.errors import AlreadyExists
from aenv.core.ids import new_sandbox_id
from aenv.orchestrator import disk_mode, restore_match
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.envd_process import EnvdProcesses
from aenv.orchestrator.ops.boot import Booted, boot_sandbox, discard
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.storage.repository import Snapshot, SnapshotDraft

log = logging.getLogger("aenv.orchestrator.template_image")

#: Part of every image id: a new value makes nodes take their template images again (2: the
#: image is taken after a warm-up command).
IMAGE_RECIPE = "2"


def image_id(node: Node, template: Template) -> str:
    """Named by what makes the image (layer ids, the bundle's version, the runtime, the CPUs
    and memory its sandbox had, the disk size), never by host paths: nodes sharing a
    repository share the image, and a node whose defaults differ (a template without its own
    CPUs or memory takes the node's) makes its own, since a restore keeps the saved shape."""
    cpu = template.cpu_count or node.settings.default_cpu_count
    memory = template.memory_mb or node.settings.default_memory_mb
    key = "\n".join([IMAGE_RECIPE, template.template_id, *(p.name for p in template.layers),
                     node.envd_bundle.name,
                     restore_match.requirements_key(node.host_requirements),
                     f"{cpu} CPUs, {memory} MiB", *disk_mode.image_key(node)])
    return f"tpl-{template.template_id}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


async def with_memory_image(node: Node, template: Template) -> Template:
    """``template`` with ``image`` set, making the image first if the repository lacks it.

    On failure: raises (the caller may go on booting cold); nothing half-made is visible.
    """
    snapshot_id = image_id(node, template)
    snapshot = await node.repository.lookup(snapshot_id)
    if snapshot is None:
        started = time.monotonic()
        booted = await boot_sandbox(node, new_sandbox_id(), template)
        try:
            await warm_up(node, booted)
            draft = SnapshotDraft(
                snapshot_id=snapshot_id,
                kind="template",
                template_id=template.template_id,
                created_at=node.clock(),
                requirements=node.host_requirements,
                cpu_count=booted.cpu_count,
                memory_mb=booted.memory_mb,
                default_user=template.default_user,
                default_workdir=template.default_workdir,
            )
            snapshot = await _capture_or_take(node, booted, draft, template.layers)
        finally:
            await asyncio.shield(discard(node, booted))
        log.info("memory image of template %s made in %.0f ms (%.1f MB)",
                 template.template_id, (time.monotonic() - started) * 1000,
                 snapshot.manifest.memory_size_bytes / 1e6)
    m = snapshot.manifest
    restore_match.check(snapshot_id, m.requirements, node.host_requirements)
    local = await node.repository.materialize(snapshot, node.envd_bundle,
                                              disk_mode.disk_dir(node))
    # A restored kernel keeps the CPUs and memory it was saved with.
    return replace(template, image=local.image, envd_bundle=local.envd_bundle,
                   cpu_count=m.cpu_count, memory_mb=m.memory_mb, disk_image=local.disk)


async def _capture_or_take(node: Node, booted: Booted, draft: SnapshotDraft,
                           layers: Sequence[Path]) -> Snapshot:
    """:func:`capture`, or the image another node committed under the same id meanwhile
    (nodes of a cluster starting at once on one shared repository all make it; one wins)."""
    try:
        return await capture(node, booted, draft, layers)
    except AlreadyExists:
        made = await node.repository.lookup(draft.snapshot_id)
        if made is None:
            raise
        log.info("memory image %s was made by another node meanwhile: using it",
                 draft.snapshot_id)
        return made


async def warm_up(node: Node, booted: Booted, token: str | None = None, *,
                  runs: int = 2) -> None:
    """Run what a restored sandbox's first command runs (the SDK's ``bash -l -c``), so the
    image is taken with bash's files in the sentry's caches and envd's command path warm:
    a sandbox restored from it does not pay that on the user's first command. The warm pool
    runs it once more in each sandbox it restores (``warm.py``)."""
    async with EnvdProcesses(node.guests.transport(booted.slot), booted.slot, token) as run:
        for _ in range(runs):
            await run.run("/bin/bash", ["-l", "-c", "true"], user=booted.template.default_user,
                          cwd=booted.template.default_workdir, timeout_s=30.0)


async def capture(node: Node, booted: Booted, draft: SnapshotDraft,
                  layers: Sequence[Path]) -> Snapshot:
    """Checkpoint a template's sandbox and commit the image as ``draft``: with a disk
    workspace, its disk of the same instant goes along (sandboxes restore onto clones of it).

    Prerequisites: the sandbox is booted and ready; the caller discards it afterwards (it may
    have exited). On failure: nothing is visible (staging and clones removed).
    """
    staged = node.repository.stage(draft.snapshot_id)
    clone = disk_mode.seed_path(node, staged.path.name) if node.workspaces else None
    try:
        disk = None
        if clone is None:
            async with quiesced(node, booted.sandbox_id, booted.slot):
                await node.runtime.checkpoint(booted.instance, staged.memory_dir,
                                              leave_running=False)
        else:
            await disk_mode.capture(node, booted.instance, booted.slot, staged.memory_dir,
                                    clone)
            disk = await disk_mode.export(node, booted.sandbox_id, clone, draft.snapshot_id)
        return await node.repository.commit(staged, draft, layers=layers,
                                            envd_bundle=booted.envd_bundle, disk=disk)
    except BaseException:
        await asyncio.shield(node.repository.discard(staged))
        raise
    finally:
        if clone is not None:
            clone.unlink(missing_ok=True)
            disk_mode.forget(node, booted.sandbox_id)  # nobody snapshots it again
