"""Fork: one checkpoint of a running sandbox, then ``count`` children restored from it.

The source is paused once, only while its memory is saved (``--leave-running``), and runs on
in place. Each child is a new sandbox (own id, access token, network slot, rootfs mount over
the parent's read-only layers) restored concurrently from the shared image: it starts with the
parent's files (the writable layer is in memory) and live processes, and is independent
afterwards. The image is deleted once every child runs.

Prerequisites: the source is running; ``1 <= count <= max_fork_count``.
On success: one result per child, each a running ``SandboxRecord`` or the error that child
met (``ResourceExhausted`` beyond the node's limit, a failed restore); the source is running.
On failure (of the whole call): ``NotFound`` when the source does not exist (never did, or was
killed: E2B answers the whole request 404), ``Conflict`` when it is busy or paused, a failed
checkpoint (``RuntimeFailure``); the source runs on, no child exists.
With disk workspaces the clone of the source's disk the fork took is kept for its next fork,
whose children may then be made ahead (``orchestrator/fork_seeds.py``).
A crash mid-fork leaves ``creating`` children (torn down by recovery) and a staging image
(removed at start); the source is re-attached as running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from aenv.core.errors import (
    AenvError,
    Conflict,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RuntimeFailure,
)
from aenv.core.ids import new_sandbox_id
from aenv.core.states import SandboxState
from aenv.core.timeouts import timeout_or_default
from aenv.orchestrator import disk_mode, fork_seeds
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.egress import identity_of
from aenv.orchestrator.instance_codec import envd_bundle_of
from aenv.orchestrator.ops.create import CreateParams, check_capacity, create_from
from aenv.orchestrator.ops.snapshot import back_to_running, checkpoint_running
from aenv.orchestrator.team_quota import team_starts
from aenv.orchestrator.volumes import mounts_of
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.fork")


@dataclass(frozen=True)
class ForkResult:
    sandbox: SandboxRecord | None = None
    error: AenvError | None = None


async def fork(node: Node, sandbox_id: str, count: int, timeout_s: int | None
               ) -> list[ForkResult]:
    if not 1 <= count <= node.settings.max_fork_count:
        raise InvalidArgument(f"count must be 1..{node.settings.max_fork_count}, not {count}")
    timeout = timeout_or_default(node.settings, timeout_s)
    record = await node.store.get(sandbox_id)
    if record is None or record.state == SandboxState.KILLING:
        raise NotFound(f"sandbox {sandbox_id} not found")
    return await node.owners.run(sandbox_id, "fork",
                                 lambda: _fork_owned(node, sandbox_id, count, timeout))


async def _fork_owned(node: Node, sandbox_id: str, count: int, timeout: int
                      ) -> list[ForkResult]:
    record = await node.store.get(sandbox_id)
    if record is None or record.state == SandboxState.KILLING:
        raise NotFound(f"sandbox {sandbox_id} not found")
    if record.state != SandboxState.RUNNING:
        raise Conflict(f"sandbox {sandbox_id} is {record.state.public}; fork a running one")
    try:
        fits = await check_capacity(node, count)
    except ResourceExhausted as exc:
        return [ForkResult(error=exc) for _ in range(count)]
    async with contextlib.AsyncExitStack() as held:
        try:
            await held.enter_async_context(
                team_starts(node, record.team_id, count=fits, memory_mb=record.memory_mb))
        except ResourceExhausted as exc:
            return [ForkResult(error=exc) for _ in range(count)]
        record = await node.store.update(record, state=SandboxState.FORKING)
        node.precreated.expect(fits)
        with node.precreated.busy():
            return await _fork(node, record, count, fits, timeout)


async def _fork(node: Node, record: SandboxRecord, count: int, fits: int, timeout: int
                ) -> list[ForkResult]:
    started = time.monotonic()
    # Staged like a snapshot that is never committed: a crash leaves it to the repository's
    # start-up clean-up.
    staged = node.repository.stage(f"fork-{record.sandbox_id}-{new_sandbox_id()[:8]}")
    image_dir = staged.memory_dir
    seed: Path | None = None
    try:
        try:
            if node.workspaces is not None:
                seed = disk_mode.seed_path(node, staged.snapshot_id)
                await disk_mode.checkpoint_with_disk(node, record, image_dir, seed)
            else:
                await checkpoint_running(node, record, image_dir)
        finally:
            await back_to_running(node, record)
        saved = time.monotonic()
        # Disk workspaces: the seed kept from this parent's previous fork when its files are
        # the same, so that the children made ahead on it serve (orchestrator/fork_seeds.py).
        disk = None if seed is None else await fork_seeds.reuse(record.sandbox_id, seed)
        template = replace(_parent_template(node, record, image_dir), disk_image=disk)
        params = CreateParams(
            template=template.template_id,
            timeout_s=timeout,
            auto_pause=record.auto_pause,
            auto_pause_memory=record.auto_pause_memory,
            auto_resume=record.auto_resume,
            allow_internet_access=record.allow_internet_access,
            network=record.network,
            identity_tokens=identity_of(record),
            fresh_boot_id=False,  # a child continues its parent's boot
            team_id=record.team_id,
            # The parent keeps writing its volumes; its children read them (one writer).
            inherited_volumes=tuple(replace(m, read_only=True)
                                    for m in mounts_of(record.volume_mounts)),
        )
        outcomes = await asyncio.gather(
            # Not detached: a kill of the source that cancels the fork abandons its children.
            *(create_from(node, template, params, detach=False) for _ in range(fits)),
            return_exceptions=True
        )
        if seed is None:
            # The next fork of this family finds its children created ahead.
            node.precreated.want_family(template)
        else:
            kept = await fork_seeds.settle(node, record.sandbox_id,
                                           template.disk_image or seed, seed)
            seed = None  # kept or removed by ``settle``
            if kept is not None:
                # The same, on disks cloned from the seed kept for the parent's next fork.
                node.precreated.want_family(replace(template, disk_image=kept))
    finally:
        await node.repository.discard(staged)
        if seed is not None:
            seed.unlink(missing_ok=True)  # each child has its own clone of it
    results = [_result(o) for o in outcomes]
    limit = ResourceExhausted(
        f"this node runs its maximum of {node.settings.max_sandboxes} sandboxes"
    )
    results += [ForkResult(error=limit) for _ in range(count - fits)]
    ok = sum(1 for r in results if r.sandbox is not None)
    log.info("forked %s into %d/%d in %.0f ms (checkpoint %.0f ms)", record.sandbox_id, ok,
             count, (time.monotonic() - started) * 1000, (saved - started) * 1000)
    return results


def _parent_template(node: Node, record: SandboxRecord, image_dir: Path) -> Template:
    lowers = node.rootfs.recorded_lowers(record.sandbox_id) or []
    return Template(
        template_id=record.template_id,
        alias=record.alias,
        layers=tuple(lowers),
        cpu_count=record.cpu_count,
        memory_mb=record.memory_mb,
        image=image_dir,
        envd_bundle=envd_bundle_of(record.instance, node.envd_bundle),
        envd_token=record.envd_token,
        env_vars=dict(record.env_vars),
        metadata=dict(record.metadata),
    )


def _result(outcome: SandboxRecord | BaseException) -> ForkResult:
    if isinstance(outcome, SandboxRecord):
        return ForkResult(sandbox=outcome)
    if isinstance(outcome, AenvError):
        return ForkResult(error=outcome)
    log.error("fork child failed", exc_info=outcome)
    return ForkResult(error=RuntimeFailure(f"fork child failed: {outcome!r}"))
