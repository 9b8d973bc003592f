"""Cold start: a sandbox booted straight from an OCI image (``POST /sandboxes-cold``).

Prerequisites: the node has an image store; ``image`` is a reference it may pull.
On success: the image is pulled (once per reference; concurrent cold starts of one image
share the pull) and its layers unpacked (once per layer); a sandbox is booted over them with
envd from its bundle (not from the image), initialised with the image's environment (its
``Env``, overridden by ``envVars``), its ``USER`` (else ``user`` if the image has one, else
root) and its ``WorkingDir``; ``start_cmd``, if given, runs in the background; the record is
``running``, answered like a create.
On failure: as a create, plus the pull's errors (``NotFound`` image, ``PermissionDenied`` /
``Unauthenticated`` credentials, ``Unavailable`` registry, ``InvalidArgument`` for a bad
reference or a hostile layer, ``NotEnoughSpace`` over the cache); nothing is left running.
"""

from __future__ import annotations

import asyncio

from aenv.core.errors import FailedPrecondition
from aenv.core.net import NetSlot
from aenv.envd.process.console_tee import START_TAG
from aenv.orchestrator.build_image import default_user
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.envd_process import EnvdProcesses
from aenv.orchestrator.instance_codec import decode
from aenv.orchestrator.ops.create import CreateParams, check_capacity, create_from
from aenv.orchestrator.ops.kill import kill
from aenv.store.models import SandboxRecord


async def cold_start(
    node: Node, image: str, params: CreateParams, *, cpu_count: int | None,
    memory_mb: int | None, start_cmd: str | None, auth: tuple[str, str] | None,
) -> SandboxRecord:
    await check_capacity(node)
    async with node.images.image(image, auth=auth) as pulled:
        env: dict[str, str] = {}
        for item in pulled.config.env:
            key, sep, value = item.partition("=")
            if sep and key:
                env[key] = value
        user = await default_user(list(pulled.layers), pulled.config.user,
                                  node.build_dir / "scratch")
        template = Template(
            template_id=pulled.reference, alias=None, layers=pulled.layers,
            cpu_count=cpu_count, memory_mb=memory_mb, default_user=user,
            default_workdir=pulled.config.workdir or None, env_vars=env,
        )
        record = await create_from(node, template, params)
    if start_cmd:
        try:
            async with EnvdProcesses(node.guests.transport(_slot(record)), _slot(record),
                                     record.envd_token) as processes:
                await processes.start("/bin/bash", ["-l", "-c", start_cmd], user=user,
                                      cwd=template.default_workdir, tag=START_TAG)
        except BaseException:
            await asyncio.shield(kill(node, record.sandbox_id))
            raise
    return record


def _slot(record: SandboxRecord) -> NetSlot:
    slot, _ = decode(record.instance, record.sandbox_id)
    if slot is None:
        raise FailedPrecondition(f"sandbox {record.sandbox_id} has no network slot")
    return slot
