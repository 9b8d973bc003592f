"""Start one sandbox up to "envd answers": slot, rootfs, runtime, readiness.

A template with a memory image is *restored* (envd is already running in the image); one
without is booted cold. A restore may go into a *pre-created* sandbox (``precreate_sandbox``:
slot, rootfs and runtime processes made ahead, ``orchestrator/precreated.py``). Shared by
create, fork, the warm pool and the pre-created pool. On failure everything acquired here is
released again before the error propagates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from aenv.core.errors import ResourceExhausted
from aenv.core.net import EgressPolicy, NetSlot
from aenv.core.unwind import to_the_end
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.envd_client import EnvdClient
from aenv.runtime.base import Instance, MemoryImage, SandboxSpec, VolumeBind

if TYPE_CHECKING:
    from aenv.orchestrator.precreated import Precreated


@dataclass
class Booted:
    sandbox_id: str
    template: Template
    slot: NetSlot
    instance: Instance
    cpu_count: int
    memory_mb: int
    envd_bundle: Path
    #: Milliseconds per phase, for the create log line and benchmarks.
    phases: dict[str, float] = field(default_factory=dict)
    #: The access token envd holds already, given with the template's env vars, user and
    #: workdir and a fresh boot id (a warm sandbox, primed ahead): a create that asks for
    #: nothing more skips its ``/init`` (~25 ms). None: envd was not initialised since boot.
    primed_token: str | None = None


class Laps:
    """Milliseconds per named phase, each since the previous call."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._mark = time.monotonic()

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = (now - self._mark) * 1000
        self._mark = now


async def boot_sandbox(
    node: Node,
    sandbox_id: str,
    template: Template,
    *,
    on_slot: Callable[[NetSlot], Awaitable[None]] | None = None,
    policy: EgressPolicy | None = None,
    root_writes: Literal["memory", "host"] = "memory",
    precreated: Precreated | None = None,
    volumes: tuple[VolumeBind, ...] = (),
) -> Booted:
    """Prerequisites: ``sandbox_id`` is new, or ``precreated`` is a pre-created sandbox of
    ``template``'s shape with that id (then ``on_slot`` and ``policy`` are the caller's
    business). On success: envd answers ``/health`` in the sandbox (not yet initialised).
    On failure: nothing of it is left; the error propagates."""
    lap = Laps()
    cpu = template.cpu_count or node.settings.default_cpu_count
    memory = template.memory_mb or node.settings.default_memory_mb
    bundle = template.envd_bundle or node.envd_bundle
    instance: Instance | None = None
    if precreated is not None:
        slot, instance = precreated.slot, precreated.instance
    else:
        slot = await acquire_slot(node, policy)
    try:
        if precreated is not None:
            assert template.image is not None, "a pre-created sandbox is only restored into"
            lap("precreated")
            instance = await node.runtime.restore_precreated(
                precreated.instance, MemoryImage.at(template.image))
            lap("restore")
        else:
            lap("slot")
            if on_slot is not None:
                await on_slot(slot)
            rootfs = await node.rootfs.assemble(sandbox_id, template.layers,
                                                seed=template.disk_image)
            lap("rootfs")
            spec = replace(sandbox_spec(sandbox_id, rootfs, bundle, template, cpu, memory),
                           root_writes=root_writes, volumes=volumes)
            if template.image is None:
                instance = await node.runtime.boot(spec, slot)
                lap("boot")
            else:
                instance = await node.runtime.restore(MemoryImage.at(template.image), spec,
                                                      slot)
                lap("restore")
        async with EnvdClient(node.guests.transport(slot), slot) as envd:
            await envd.wait_ready(
                node.settings.envd_ready_timeout_s, restored=template.image is not None
            )
        lap("envd_ready")
        return Booted(sandbox_id, template, slot, instance, cpu, memory, bundle, lap.phases)
    except BaseException:
        await to_the_end(release(node, sandbox_id, slot, instance))
        raise


async def acquire_slot(node: Node, policy: EgressPolicy | None) -> NetSlot:
    """A network slot for a sandbox that starts now. When every slot is in use, one held by a
    sandbox waiting in the pre-created pool is given back first: a sandbox asked for beats one
    made ahead (the pool may hold 16 of a shape nobody asks for any more), then one held by a
    paused sandbox kept ready to resume (``resume_ready.py``)."""
    try:
        return await node.pool.acquire(policy)
    except ResourceExhausted:
        if not (await node.precreated.give_back() or await node.resume_ready.give_back()):
            raise
    return await node.pool.acquire(policy)


async def precreate_sandbox(node: Node, sandbox_id: str, template: Template
                            ) -> tuple[NetSlot, Instance]:
    """A slot, ``template``'s rootfs and a runtime sandbox created in them but not started
    (``Runtime.precreate``), for a later restore of an image of ``template``'s shape.
    On failure: nothing of it is left; the error propagates."""
    cpu = template.cpu_count or node.settings.default_cpu_count
    memory = template.memory_mb or node.settings.default_memory_mb
    slot = await node.pool.acquire(None)
    try:
        rootfs = await node.rootfs.assemble(sandbox_id, template.layers,
                                            seed=template.disk_image)
        bundle = template.envd_bundle or node.envd_bundle
        spec = sandbox_spec(sandbox_id, rootfs, bundle, template, cpu, memory)
        return slot, await node.runtime.precreate(spec, slot)
    except BaseException:
        await to_the_end(release(node, sandbox_id, slot, None))
        raise


def sandbox_spec(
    sandbox_id: str, rootfs: Path, envd_bundle: Path, template: Template, cpu: int, memory: int
) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id,
        rootfs=rootfs,
        envd_bundle=envd_bundle,
        cpu_count=cpu,
        memory_mb=memory,
        envd_args=("--user", template.default_user, *(
            ("--workdir", template.default_workdir) if template.default_workdir else ()
        )),
    )


async def hand_identity(node: Node, booted: Booted, *, token: str, env_vars: dict[str, str],
                        renew_boot_id: bool, volume_mounts: list[dict[str, object]] | None = None,
                        trust_certificates: list[str] | None = None) -> None:
    """envd's ``/init`` for ``booted``: ``token``, ``env_vars`` and the template's user and
    workdir, authorised by the token envd holds now (a primed one, else the template image's).
    Used by a create and by the warm pool's priming."""
    async with EnvdClient(node.guests.transport(booted.slot), booted.slot) as envd:
        await envd.init(
            token=token, env_vars=env_vars, user=booted.template.default_user,
            workdir=booted.template.default_workdir,
            current_token=booted.primed_token or booted.template.envd_token,
            renew_boot_id=renew_boot_id, volume_mounts=volume_mounts,
            trust_certificates=trust_certificates,
        )


async def release(
    node: Node, sandbox_id: str, slot: NetSlot, instance: Instance | None
) -> None:
    """Destroy what ``boot_sandbox`` or ``precreate_sandbox`` made; errors are swallowed
    (recovery removes what is left)."""
    with contextlib.suppress(Exception):
        if instance is not None:
            await node.runtime.destroy(instance)
    with contextlib.suppress(Exception):
        await node.rootfs.disassemble(sandbox_id, keep_upper=False)
    with contextlib.suppress(Exception):
        await node.guests.forget(slot)
        await node.pool.release(slot)


async def discard(node: Node, booted: Booted) -> None:
    """Destroy a booted sandbox nobody claimed."""
    await release(node, booted.sandbox_id, booted.slot, booted.instance)
