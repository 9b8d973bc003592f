"""A build's last step: the template's memory image, taken once its ready command succeeds.

A sandbox of the final stage is started (a normal one: written files in sandbox memory, or on
its disk workspace), the start command launched in the background, the ready command polled
until it exits 0, the first command's cold shell start paid, then the sandbox is checkpointed
(its disk of the same instant with it) and committed to the repository as a ``template``
snapshot. A rebuild that changes nothing finds the image it made
before (``IMAGE_KEY``) and reuses it. The sandbox is torn down after the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from aenv.core.errors import DeadlineExceeded, InvalidArgument
from aenv.core.ids import new_access_token, new_sandbox_id
from aenv.envd.process.console_tee import START_TAG
from aenv.orchestrator import disk_mode, restore_match
from aenv.orchestrator.build_log import BuildLog
from aenv.orchestrator.build_state import (
    FINALIZE_STEP,
    BuildFailed,
    BuildSpec,
    StageState,
    chain_key,
    user_name,
)
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.envd_process import EnvdProcesses
from aenv.orchestrator.ops.boot import boot_sandbox, discard
from aenv.orchestrator.template_image import capture
from aenv.storage.image_files import lookup_user
from aenv.storage.repository import Snapshot, SnapshotDraft
from aenv.storage.view import merged_view
from aenv.templates.plan import BuildPlan

#: Manifest metadata naming what a template image was made from (a rebuild that changes
#: nothing reuses the image instead of booting and checkpointing again).
IMAGE_KEY = "aenv.image-key"
#: Sandboxes of finished builds being torn down.
_BACKGROUND: set[asyncio.Task[None]] = set()
#: How often the ready command is tried, and how long one try may take.
READY_POLL_S = 0.5
READY_TRY_TIMEOUT_S = 30.0


async def default_user(layers: Sequence[Path], user: str, scratch: Path) -> str:
    """Who a template's sandboxes run commands as: its USER, else ``user`` if the image has
    one (E2B's convention), else root."""
    if user:
        return user_name(user)
    async with merged_view(layers, scratch) as view:
        try:
            lookup_user(view, "user")
        except InvalidArgument:
            return "root"
    return "user"


async def finalize(node: Node, state: StageState, plan: BuildPlan, spec: BuildSpec,
                    log_: BuildLog) -> Snapshot:
    user = await default_user(state.layers, state.user, spec.scratch_dir)
    template = Template(
        template_id=spec.template_id, alias=spec.name, layers=tuple(state.layers),
        cpu_count=spec.cpu_count, memory_mb=spec.memory_mb, default_user=user,
        default_workdir=state.workdir,
        env_vars=dict(state.env),
    )
    key = chain_key(state.chain, "IMAGE", plan.start_cmd, plan.ready_cmd, spec.cpu_count,
                 spec.memory_mb, node.envd_bundle.name, user, state.workdir,
                 restore_match.requirements_key(node.host_requirements),
                 *disk_mode.image_key(node))
    if not plan.force:
        for existing in node.repository.list(kind="template"):
            m = existing.manifest
            if m.template_id == spec.template_id and m.metadata.get(IMAGE_KEY) == key:
                log_.info("CACHED memory image (nothing changed)", FINALIZE_STEP)
                return existing
    snapshot_id = f"tpl-{spec.template_id}-{spec.build_id}"[:64]
    log_.info(f"starting the template sandbox (user {user}, "
              f"workdir {state.workdir or 'home'})", FINALIZE_STEP)
    booted = await boot_sandbox(node, new_sandbox_id(), template)
    try:
        token = new_access_token()
        transport = node.guests.transport(booted.slot)
        async with EnvdClient(transport, booted.slot) as envd:
            await envd.init(token=token, env_vars=dict(state.env), user=user,
                            workdir=state.workdir)
        async with EnvdProcesses(transport, booted.slot, token) as processes:
            if plan.start_cmd:
                log_.info(f"start command: {plan.start_cmd}", FINALIZE_STEP)
                pid = await processes.start("/bin/bash", ["-l", "-c", plan.start_cmd],
                                            user=user, cwd=state.workdir, tag=START_TAG)
                log_.info(f"start command runs as pid {pid}", FINALIZE_STEP)
            if plan.ready_cmd:
                await wait_ready(processes, plan.ready_cmd, user, state.workdir,
                                  spec.ready_timeout_s, log_)
            # The first command of a restored sandbox pays a cold shell start; pay it here.
            await processes.run("/bin/bash", ["-l", "-c", "true"], user=user,
                                cwd=state.workdir, timeout_s=30.0)
        draft = SnapshotDraft(
            snapshot_id=snapshot_id, kind="template", template_id=spec.template_id,
            names=[spec.name] if spec.name else [],
            created_at=node.clock(), requirements=node.host_requirements,
            cpu_count=booted.cpu_count, memory_mb=booted.memory_mb, default_user=user,
            default_workdir=state.workdir, env_vars=dict(state.env), envd_token=token,
            metadata={IMAGE_KEY: key},
            # The template's team, for another node that serves this image by name
            # (api/ownership.py): None for the default team, as every object writes it.
            team_id=node.tenancy.template_team(spec.template_id),
        )
        snapshot = await capture(node, booted, draft, state.layers)
        log_.info(f"memory image taken ({snapshot.manifest.memory_size_bytes / 1e6:.1f} MB"
                  + (", with its disk)" if snapshot.manifest.disk else ")"), FINALIZE_STEP)
    except BaseException:
        await asyncio.shield(discard(node, booted))
        raise
    # The image is committed: tearing the sandbox down (~2 s here, mostly the runtime's teardown)
    # need not delay the build's answer. A crash meanwhile leaves an orphan recovery removes.
    task = asyncio.create_task(discard(node, booted), name=f"discard-{booted.sandbox_id}")
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return snapshot


async def wait_ready(processes: EnvdProcesses, ready_cmd: str, user: str,
                      workdir: str | None, timeout_s: float, log_: BuildLog) -> None:
    log_.info(f"ready command: {ready_cmd}", FINALIZE_STEP)
    deadline = time.monotonic() + timeout_s
    tries = 0
    last = None
    while time.monotonic() < deadline:
        tries += 1
        try:
            end = await processes.run("/bin/bash", ["-l", "-c", ready_cmd], user=user,
                                      cwd=workdir, timeout_s=READY_TRY_TIMEOUT_S)
            last = end.exit_code
            if end.exit_code == 0:
                log_.info(f"ready after {tries} tries", FINALIZE_STEP)
                return
        except DeadlineExceeded:
            last = None
        await asyncio.sleep(READY_POLL_S)
    raise BuildFailed(
        f"the ready command did not succeed within {timeout_s:.0f}s ({tries} tries, "
        f"last exit code {last})", FINALIZE_STEP)
