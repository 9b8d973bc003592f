"""An honest in-memory runtime for control-plane tests: real state, no processes.

``FakeRuntime`` keeps what a driver would keep and enforces what the gVisor driver enforces
(ids, preconditions, one live sandbox per id and per slot, idempotent destroy), so orchestrator
tests exercise real rules. It passes the same contract suite as ``GvisorRuntime``
(``tests/runtime/test_contract.py``). Nothing listens on the guest's envd port: tests that need
envd answering use the real driver.

Test hooks, never called by product code: ``crash`` (the sandbox's processes die, as after an
OOM of the sentry), ``fail_next_boot`` and ``boot_delay_s``.

Owns: its dict. Must not touch: anything on the machine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from aenv.core.errors import (
    AenvError,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from aenv.core.ids import is_sandbox_id
from aenv.network.base import NetSlot
from aenv.runtime.base import Instance, Observed, SandboxSpec, Stats

#: What an idle gVisor sandbox with envd uses (measured: ~45 MB in its memory cgroup).
IDLE_MEMORY = 45 * 1024 * 1024


@dataclass
class _Sandbox:
    spec: SandboxSpec
    net: NetSlot
    pid: int
    status: str = "running"
    booted: float = field(default_factory=time.monotonic)


class FakeRuntime:
    """``runtime.base.Runtime`` kept in memory."""

    name = "fake"

    def __init__(self) -> None:
        self._sandboxes: dict[str, _Sandbox] = {}
        self._pids = itertools.count(100_000)
        self._fail_next: AenvError | None = None
        #: Seconds every boot takes (to test timeouts and concurrency).
        self.boot_delay_s = 0.0

    async def boot(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Same contract as ``GvisorRuntime.boot``, minus the processes."""
        sid = spec.sandbox_id
        if not is_sandbox_id(sid):
            raise InvalidArgument(f"{sid!r} is not a sandbox id (20 characters a-z0-9)")
        if not spec.rootfs.is_dir():
            raise FailedPrecondition(f"rootfs {spec.rootfs} of sandbox {sid} is not a directory")
        if spec.cpu_count < 1 or spec.memory_mb < 16:
            raise InvalidArgument("a sandbox needs at least 1 CPU and 16 MiB of memory")
        current = self._sandboxes.get(sid)
        if current is not None and current.status != "stopped":
            raise AlreadyExists(f"sandbox {sid} already runs here ({current.status})")
        for other_id, other in self._sandboxes.items():
            if other.net.index == net.index and other.status != "stopped" and other_id != sid:
                raise FailedPrecondition(f"slot {net.index} is used by sandbox {other_id}")
        if self.boot_delay_s:
            await asyncio.sleep(self.boot_delay_s)
        if self._fail_next is not None:
            exc, self._fail_next = self._fail_next, None
            raise exc
        sandbox = _Sandbox(spec=spec, net=net, pid=next(self._pids))
        self._sandboxes[sid] = sandbox
        return Instance(sandbox_id=sid, runtime_id=sid, pid=sandbox.pid, net=net)

    async def destroy(self, instance: Instance) -> None:
        """Forget the sandbox. Idempotent."""
        self._sandboxes.pop(instance.runtime_id, None)

    async def observe(self) -> list[Observed]:
        return [
            Observed(
                runtime_id=sid,
                sandbox_id=sid,
                status=s.status,
                pid=s.pid if s.status != "stopped" else None,
            )
            for sid, s in self._sandboxes.items()
        ]

    async def stats(self, instance: Instance) -> Stats:
        sandbox = self._sandboxes.get(instance.runtime_id)
        if sandbox is None or sandbox.status == "stopped":
            raise NotFound(f"sandbox {instance.sandbox_id} is not running")
        mem_total = sandbox.spec.memory_mb * 1024 * 1024
        return Stats(
            cpu_count=sandbox.spec.cpu_count,
            cpu_used_pct=0.0,
            mem_used=min(IDLE_MEMORY, mem_total),
            mem_total=mem_total,
            mem_cache=0,
            disk_used=0,
            disk_total=0,
        )

    # ---------------------------------------------------------------- test hooks

    def crash(self, sandbox_id: str) -> None:
        """Make the sandbox's processes die (observe() then says ``stopped``)."""
        self._sandboxes[sandbox_id].status = "stopped"

    def fail_next_boot(self, exc: AenvError) -> None:
        """Make the next boot raise ``exc`` (after its checks), leaving nothing behind."""
        self._fail_next = exc
