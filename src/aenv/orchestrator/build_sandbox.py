"""RUN steps: one command in a fresh build sandbox, whose writes become one layer.

A Dockerfile is untrusted input, so a RUN never touches the host kernel: it runs as a process
in a sandbox made like any other (its own network slot and cgroup, the template's CPU
and memory), booted over the stage's layers with ``root_writes="host"``: the sandbox's root
writes go through the gofer into the overlay's upper directory on the host, which after the
command is exactly the step's diff in overlayfs format (whiteouts as 0:0 character devices,
opaque directories marked) — ready to be a read-only lower as it is.

Prerequisites: the lowers exist; the node has a free network slot.
On success: the command exited 0 and its upper is committed as layer ``layer_id`` (the runtime's
mount points, empty placeholders no image has, are removed first).
On failure: ``StepFailed`` with the exit code (the upper is discarded); ``DeadlineExceeded``
past the step's timeout; boot errors as ``boot_sandbox``'s. Nothing of the sandbox is left:
runtime destroyed, slot released, rootfs pieces removed. A crash mid-step leaves a sandbox no
record names; recovery destroys it as an orphan, and ``LayerStore.clean_staging`` sweeps a
half-moved upper.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import AenvError
from aenv.core.ids import new_access_token, new_sandbox_id
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.envd_client import EnvdClient
from aenv.orchestrator.envd_process import EnvdProcesses
from aenv.orchestrator.ops.boot import Booted, boot_sandbox
from aenv.runtime.base import ENVD_MOUNT
from aenv.storage.layers import Layer, LayerStore

#: Mount points the runtime makes in every root (runtime/oci.py): in a build upper they are
#: empty placeholders, not the image's files.
RUNTIME_MOUNT_POINTS = ("etc/hosts", "etc/hostname", "etc/resolv.conf",
                        ENVD_MOUNT.lstrip("/"), "usr/local/bin/sudo")


class StepFailed(AenvError):
    """A build command exited non-zero (400: the template's fault, not the node's)."""

    http_status = 400
    connect_code = "failed_precondition"

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunStep:
    command: str
    user: str
    workdir: str | None
    env: Mapping[str, str]
    cpu_count: int
    memory_mb: int
    timeout_s: float


async def run_step(
    node: Node, layers: LayerStore, lowers: Sequence[Path], step: RunStep, *, layer_id: str,
    on_output: Callable[[str, str], None],
) -> Layer:
    """Run ``step`` over ``lowers`` and commit its writes as layer ``layer_id`` (see module)."""
    sandbox_id = new_sandbox_id()
    template = Template(
        template_id="build", alias=None, layers=tuple(lowers), cpu_count=step.cpu_count,
        memory_mb=step.memory_mb, default_user="root", default_workdir="/",
    )
    booted = await boot_sandbox(node, sandbox_id, template, root_writes="host")
    upper = node.rootfs.upper(sandbox_id)
    try:
        try:
            end = await _execute(node, booted, step, on_output)
        finally:
            await asyncio.shield(_stop(node, booted))
        if end != 0:
            raise StepFailed(f"command exited with code {end}", end)
        return await _commit_upper(layers, upper, lowers, layer_id)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(node.rootfs.disassemble(sandbox_id, keep_upper=False))


async def _execute(
    node: Node, booted: Booted, step: RunStep, on_output: Callable[[str, str], None]
) -> int:
    token = new_access_token()
    transport = node.guests.transport(booted.slot)
    async with EnvdClient(transport, booted.slot) as envd:
        await envd.init(token=token, env_vars=dict(step.env), user="root", workdir="/")
    async with EnvdProcesses(transport, booted.slot, token) as processes:
        end = await processes.run(
            "/bin/sh", ["-c", step.command], user=step.user, cwd=step.workdir,
            envs=step.env, timeout_s=step.timeout_s, on_output=on_output,
        )
    if end.error and end.exit_code == 0:
        return 1
    return end.exit_code


async def _stop(node: Node, booted: Booted) -> None:
    """Destroy the build sandbox but keep its upper (the step's result)."""
    with contextlib.suppress(Exception):
        await node.runtime.destroy(booted.instance)
    with contextlib.suppress(Exception):
        await node.guests.forget(booted.slot)
        await node.pool.release(booted.slot)
    if node.workspaces is None:
        await node.rootfs.disassemble(booted.sandbox_id, keep_upper=True)
    # With disk workspaces the upper is inside the sandbox's disk image: it stays attached
    # (nothing writes it any more) until _commit_upper has copied it out.


async def _commit_upper(
    layers: LayerStore, upper: Path, lowers: Sequence[Path], layer_id: str
) -> Layer:
    await asyncio.to_thread(_drop_placeholders, upper, lowers)
    async with layers.staging(layer_id) as staging:
        staging.rmdir()
        try:
            upper.rename(staging)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # The layer store lives on another filesystem than the sandboxes: copy, keeping
            # owners, modes, xattrs (opaque markers) and whiteout devices.
            await proc.run(["cp", "-a", "--", str(upper), str(staging)], timeout=3600)
            await asyncio.to_thread(shutil.rmtree, upper, True)
        # staging()'s flock was on the directory the upper replaced: lock this one, or a node
        # starting on a shared layer store sweeps it as a crash's leftover before the commit.
        held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return await layers.put_from_dir(staging, layer_id, recipe={"kind": "build-step"})
        finally:
            os.close(held)


def _exists_below(lowers: Sequence[Path], rel: str) -> bool:
    return any(os.path.lexists(os.path.join(lower, rel)) for lower in lowers)


def _drop_placeholders(upper: Path, lowers: Sequence[Path]) -> None:
    """Remove the runtime's empty mount points (and the directories made only for them)."""
    for rel in RUNTIME_MOUNT_POINTS:
        path = upper / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        empty = (stat.S_ISREG(st.st_mode) and st.st_size == 0) or (
            stat.S_ISDIR(st.st_mode) and not any(path.iterdir()))
        if not empty or _exists_below(lowers, rel):
            continue
        if stat.S_ISDIR(st.st_mode):
            path.rmdir()
        else:
            path.unlink()
        parent = os.path.dirname(rel)
        while parent and not _exists_below(lowers, parent):
            try:
                (upper / parent).rmdir()
            except OSError:
                break
            parent = os.path.dirname(parent)
