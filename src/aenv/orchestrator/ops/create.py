"""Create a sandbox: slot, rootfs, boot, envd ready and initialised, then ``running``.

Prerequisites: the template exists; the node is under its sandbox limit.
On success: the record is ``running`` and envd answers with the sandbox's access token.
On failure: everything acquired is released and the record deleted; the error propagates
(``NotFound`` template, ``ResourceExhausted`` limit, ``Unavailable``/``RuntimeFailure`` boot).
A crash mid-create leaves a ``creating`` record that recovery tears down.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from aenv.core import telemetry
from aenv.core.errors import FailedPrecondition, NotFound, ResourceExhausted
from aenv.core.ids import new_access_token, new_client_id, new_sandbox_id
from aenv.core.net import EgressPolicy, NetSlot
from aenv.core.states import SandboxState
from aenv.core.unwind import to_the_end
from aenv.envd.volume_binds import slot_count
from aenv.orchestrator import egress_trust, traffic
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.egress import policy_from
from aenv.orchestrator.instance_codec import instance_json
from aenv.orchestrator.ops.boot import Booted, boot_sandbox, discard, hand_identity, release
from aenv.orchestrator.ops.teardown import teardown
from aenv.orchestrator.team_quota import team_starts
from aenv.orchestrator.volumes import Mounted, MountRequest, mounts_of, slot_binds
from aenv.orchestrator.workload_identity import TokenSpec
from aenv.store.models import SandboxRecord

if TYPE_CHECKING:
    from aenv.orchestrator.precreated import Precreated

log = logging.getLogger("aenv.orchestrator")

_LIVE = [SandboxState.CREATING, SandboxState.RUNNING, SandboxState.RESUMING,
         SandboxState.SNAPSHOTTING, SandboxState.FORKING]


@dataclass(frozen=True)
class CreateParams:
    template: str
    timeout_s: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    #: False: a pause at the end of the lifetime keeps the files only (E2B
    #: ``autoPauseMemory``; nodes with disk workspaces).
    auto_pause_memory: bool = True
    auto_resume: bool = False
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    #: A new boot as the user sees it: its own /proc/sys/kernel/random/boot_id. False for a
    #: fork child, which continues its parent's boot.
    fresh_boot_id: bool = True
    #: A fork child restored on another node from a snapshot of its parent (the cluster's
    #: fork spread): the parent's template id and alias, which it is of, as a child forked on
    #: the parent's node is (``fork.py``). None: of the template it is made from.
    fork_of: tuple[str, str | None] | None = None
    #: ``volumeMounts`` as asked for (checked and checked out by ``orchestrator/volumes.py``).
    volume_mounts: tuple[MountRequest, ...] = ()
    #: A fork child's volumes: its parent's, read-only.
    inherited_volumes: tuple[Mounted, ...] = ()
    #: The team it is made for (``orchestrator/tenancy.py``; None: the default team).
    team_id: str | None = None
    #: E2B's ``iam`` tokens its egress rules may name (``workload_identity.py``).
    identity_tokens: tuple[TokenSpec, ...] = ()


async def create(node: Node, params: CreateParams) -> SandboxRecord:
    started, failure = time.monotonic(), None
    try:
        return await _create_admitted(node, params)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        telemetry.observe_operation("create", failure, time.monotonic() - started)


async def _create_admitted(node: Node, params: CreateParams) -> SandboxRecord:
    template = await node.templates.resolve(params.template)
    if template.image is not None:
        node.precreated.expect()
    # A bounded number start at once, the limit checked for each under the admission's lock.
    admitted = node.admission.start(lambda starting: check_capacity(node, starting=starting))
    memory = template.memory_mb or node.settings.default_memory_mb
    async with (team_starts(node, params.team_id, count=1, memory_mb=memory), admitted,
                layers_present(node, template)):
        record = await create_from(node, template, params)
    # Built templates count their spawns (E2B's ``spawnCount``); ``base`` and snapshots do not,
    # and their creates skip the write.
    if template.snapshot_id is None and template.template_id != node.settings.default_template:
        await node.template_store.count_spawn(template.template_id, node.clock())
    return record


def layers_present(node: Node, template: Template) -> contextlib.AbstractAsyncContextManager[None]:
    """Inside: the template's layers are on this node (evicted image layers fetched again) and
    kept from eviction until the sandbox's rootfs holds them."""
    return node.images.layers_present(template.layers)


async def check_capacity(node: Node, wanted: int = 1, starting: int = 0) -> int:
    """How many of ``wanted`` sandboxes fit under the node's limit; ``ResourceExhausted`` if
    not even one does. ``starting``: admitted creates, some perhaps without a record yet."""
    live = await node.store.count(_LIVE)
    if starting:
        live += max(0, starting - await node.store.count([SandboxState.CREATING]))
    free = node.settings.max_sandboxes - live
    if free <= 0:
        telemetry.REFUSALS.labels(reason="node_full").inc()
        raise ResourceExhausted(
            f"this node runs its maximum of {node.settings.max_sandboxes} sandboxes"
        )
    if node.workspaces is not None:  # the host disk under the pool above its watermark: 429
        await node.workspaces.ensure_host_room("a new sandbox")
    return min(free, wanted)


async def create_from(node: Node, template: Template, params: CreateParams, *,
                      detach: bool = True) -> SandboxRecord:
    """Create a sandbox of an already resolved ``template`` (a fork child's template is the
    parent's memory image). Contract: as the module's."""
    policy = policy_from(params.allow_internet_access, params.network, params.team_id,
                         identity=params.identity_tokens)
    traffic.check(params.network)
    if template.volume_mounts and not (params.volume_mounts or params.inherited_volumes):
        # A snapshot of a sandbox with volumes: its image has them mounted, so its sandboxes
        # mount them again, read-only as a fork's children do (its source may still write).
        params = replace(params, inherited_volumes=tuple(
            replace(m, read_only=True) for m in mounts_of(list(template.volume_mounts))))
    if (params.volume_mounts and template.image is not None
            and not slot_count(template.envd_bundle or node.envd_bundle)):
        # A restore brings back only the mounts its checkpoint had, and an image made with
        # an envd bundle older than volume slots (envd/volume_binds.py) has none: a volume
        # would not be there (measured: its path then reaches the host through the root,
        # and read-only is not enforced). So such a sandbox boots from the layers.
        template = replace(template, image=None, envd_token=None)
    warm = pre = None
    # A sandbox with volumes boots with their binds: the pools' sandboxes have none.
    if not (params.volume_mounts or params.inherited_volumes):
        warm = node.warm.take(template)
        if warm is None and template.image is not None:
            pre = node.precreated.take(template)
            if pre is None and template.snapshot_id is not None:
                # Sandboxes of a snapshot come in waves (an RL group, a fan-out): the next
                # ones find pre-created sandboxes of its shape. Unlike a fork's, a snapshot's
                # disk image stays, so this works with disk workspaces too.
                node.precreated.want(template)
    with node.precreated.busy():
        return await _create(node, template, params, policy, warm, pre, detach)


async def _create(node: Node, template: Template, params: CreateParams, policy: EgressPolicy,
                  warm: Booted | None, pre: Precreated | None, detach: bool) -> SandboxRecord:
    now = node.clock()
    claimed = warm or pre
    template_id, alias = params.fork_of or (template.template_id, template.alias)
    record = SandboxRecord(
        sandbox_id=claimed.sandbox_id if claimed else new_sandbox_id(),
        template_id=template_id,
        alias=alias,
        state=SandboxState.CREATING,
        version=1,
        created_at=now,
        started_at=now,
        end_at=now + params.timeout_s,
        cpu_count=template.cpu_count or node.settings.default_cpu_count,
        memory_mb=template.memory_mb or node.settings.default_memory_mb,
        disk_size_mb=node.settings.disk_size_mb,
        envd_token=(warm.primed_token if warm is not None and warm.primed_token
                    else new_access_token()),
        client_id=new_client_id(),
        metadata={**template.metadata, **params.metadata},
        env_vars={**template.env_vars, **params.env_vars},
        auto_pause=params.auto_pause,
        auto_pause_memory=params.auto_pause_memory,
        auto_resume=params.auto_resume,
        allow_internet_access=params.allow_internet_access,
        network=params.network,
        instance=(instance_json(warm.slot, warm.instance, envd_bundle=warm.envd_bundle)
                  if warm else instance_json(pre.slot, pre.instance) if pre else None),
        team_id=params.team_id,
        identity_tokens=[asdict(t) for t in params.identity_tokens] or None,
    )
    policy = replace(policy, sandbox_id=record.sandbox_id)
    # The create is the new sandbox's first operation: a kill of it meanwhile cancels the
    # create, which abandons its record (``_abandon``) before the kill's teardown runs.
    return await node.owners.run(
        record.sandbox_id, "create",
        lambda: _create_owned(node, template, params, policy, warm, pre, record),
        detach=detach)


async def _create_owned(node: Node, template: Template, params: CreateParams,
                        policy: EgressPolicy, warm: Booted | None, pre: Precreated | None,
                        record: SandboxRecord) -> SandboxRecord:
    try:
        await node.store.insert(record)
    except BaseException:
        if warm is not None:
            await to_the_end(discard(node, warm))
        if pre is not None:
            await to_the_end(release(node, pre.sandbox_id, pre.slot, pre.instance))
        raise
    from_pool = warm is not None
    try:
        mounted = await _volumes(node, record.sandbox_id, params)
        if mounted:
            record = await node.store.update(record,
                                             volume_mounts=[m.as_json() for m in mounted])
        if warm is None:
            if pre is not None and policy != EgressPolicy():
                await node.pool.set_egress(pre.slot, policy)
            warm = await boot_sandbox(
                node, record.sandbox_id, template, on_slot=partial(_persist_slot, node, record),
                policy=policy, precreated=pre,
                volumes=node.volumes.binds(record.sandbox_id, mounted),
            )
            record = await node.store.require(record.sandbox_id)
            record = await node.store.update(record, instance=instance_json(
                warm.slot, warm.instance, envd_bundle=warm.envd_bundle))
        elif policy != EgressPolicy():
            await node.pool.set_egress(warm.slot, policy)
        return await _initialise(node, record, warm, from_pool=from_pool,
                                 renew_boot_id=params.fresh_boot_id)
    except BaseException:
        await to_the_end(_abandon(node, record.sandbox_id))
        raise


async def _volumes(node: Node, sandbox_id: str, params: CreateParams) -> list[Mounted]:
    if params.volume_mounts:
        return await node.volumes.attach(sandbox_id, params.volume_mounts, params.team_id)
    if params.inherited_volumes:
        try:
            await node.volumes.adopt(sandbox_id, params.inherited_volumes)
        except NotFound as exc:
            raise FailedPrecondition(f"a volume this sandbox's image has mounted is gone: "
                                     f"{exc.message}") from exc
    return list(params.inherited_volumes)


async def _persist_slot(node: Node, record: SandboxRecord, slot: NetSlot) -> None:
    # Before the slot is used, so recovery can release it after a crash.
    await node.store.update(record, instance=instance_json(slot, None))


async def _initialise(
    node: Node, record: SandboxRecord, booted: Booted, *, from_pool: bool, renew_boot_id: bool
) -> SandboxRecord:
    """Hand the booted sandbox its identity (token, env vars, user) and mark it running; a
    primed sandbox (``warm.py``) has it already unless the create asks for more."""
    started = time.monotonic()
    volume_mounts = slot_binds(booted.envd_bundle, mounts_of(record.volume_mounts))
    certificates = egress_trust.certificates(node, record.network)
    primed = (booted.primed_token is not None and booted.primed_token == record.envd_token
              and record.env_vars == booted.template.env_vars and renew_boot_id
              and not volume_mounts and not certificates)
    if not primed:
        await hand_identity(node, booted, token=record.envd_token, env_vars=record.env_vars,
                            renew_boot_id=renew_boot_id, volume_mounts=volume_mounts,
                            trust_certificates=certificates)
    # The lifetime counts from when the sandbox became usable.
    now = node.clock()
    timeout = record.end_at - record.started_at
    record = await node.store.update(
        record, state=SandboxState.RUNNING, started_at=now, end_at=now + timeout
    )
    init_ms = (time.monotonic() - started) * 1000
    # "primed": the create's own time without ``/init``, which the warm pool did ahead.
    step = "primed" if primed else "init"
    phases = {step: init_ms} if from_pool else {**booted.phases, step: init_ms}
    how = "warm" if from_pool else "pre-created" if "precreated" in phases else "cold"
    log.info("created %s (%s) in %.0f ms: %s", record.sandbox_id, how, sum(phases.values()),
             ", ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    return record


async def _abandon(node: Node, sandbox_id: str) -> None:
    record = await node.store.get(sandbox_id)
    if record is None:
        return
    try:
        record = await node.store.update(record, state=SandboxState.KILLING)
        await teardown(node, record)
        await node.store.delete(record)
    except Exception:
        log.exception("could not clean up failed create of %s; recovery will", sandbox_id)
