"""An honest in-memory runtime for control-plane tests: real state, no processes.

``FakeRuntime`` keeps what a driver would keep and enforces what the gVisor driver enforces
(ids, preconditions, one live sandbox per id and per slot, idempotent destroy), so orchestrator
tests exercise real rules. It passes the same contract suite as ``GvisorRuntime``
(``tests/runtime/test_contract.py``).

With ``guest=True`` (``runtime = "fake"`` in a node's config, runtime/registry.py) every
running sandbox has a fake guest (fake_guest.py): envd's control endpoints on the guest
address in the sandbox's network slot, so a node runs on this driver — creates, pauses,
resumes, forks and kills through its API — with no sandbox process. It needs root and real
slots (their netns). Without it (orchestrator unit tests, whose slots exist only on paper)
nothing listens on the guest's envd port.

Each sandbox has a "memory": a small dict standing for its guest state (processes, files of
the in-memory root layer). Tests write it with ``remember`` and read it with ``recall``. A
checkpoint writes the three ``IMAGE_FILES`` for real (JSON: the shape in ``checkpoint.img``,
the memory in ``pages.img``, its index in ``pages_meta.img``), and a restore reads them back, so
a restored sandbox demonstrably carries its parent's state and a torn image fails as it would.

Statuses follow runsc's: ``running``; ``paused`` after ``freeze``; ``stopped`` after a
checkpoint without ``leave_running`` or a ``crash``. ``thaw`` of a sandbox that is not frozen is
refused (the real control socket kills the sandbox then). Where runsc differs: its state file
says ``running`` until an exited sandbox is reaped (~1-2 s), the fake says ``stopped`` at once;
and a *frozen* sandbox checkpointed without ``leave_running`` stays ``paused`` under runsc (its
sentry lives on, and exits at thaw or destroy), while the fake reports it ``stopped``.

Test hooks, never called by product code: ``crash`` (the sandbox's processes die, as after an
OOM of the sentry), ``remember``/``recall``, ``fail_next_boot``, ``fail_next_restore``,
``fail_next_checkpoint``, ``boot_delay_s`` and ``restore_delay_s``.

Owns: its dict, the image directories its checkpoints write, and its guests' sockets. Must
not touch: anything else on the machine (a guest listens inside its slot, never changes it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aenv.core.errors import (
    AenvError,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RuntimeFailure,
)
from aenv.core.ids import is_sandbox_id
from aenv.core.net import NetSlot
from aenv.runtime.base import (
    IMAGE_FILES,
    Exit,
    Instance,
    MemoryImage,
    Observed,
    SandboxSpec,
    Stats,
)
from aenv.runtime.fake_guest import FakeGuest

#: What an idle gVisor sandbox with envd uses (measured: ~45 MB in its memory cgroup).
IDLE_MEMORY = 45 * 1024 * 1024
#: Written into every fake image; a restore refuses anything else (e.g. a real runsc image).
IMAGE_FORMAT = "aenv-fake-image/1"

_STATE, _PAGES_META, _PAGES = IMAGE_FILES


@dataclass
class _Sandbox:
    spec: SandboxSpec
    net: NetSlot
    pid: int
    status: str = "running"
    booted: float = field(default_factory=time.monotonic)
    #: The guest's state; what a checkpoint saves and a restore brings back.
    memory: dict[str, str] = field(default_factory=dict)
    #: Set when its processes end (crash, checkpoint without leave_running, destroy).
    exit: Exit | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: Its envd endpoints while it runs (``FakeRuntime(guest=True)``).
    guest: FakeGuest | None = None

    def end(self, exit: Exit) -> None:
        self.status = "stopped"
        if self.exit is None:
            self.exit = exit
        if self.guest is not None:
            self.guest.stop()
        self.ended.set()

    def metrics(self) -> dict[str, int | float]:
        """What envd's ``/metrics`` reports of an idle sandbox of this shape."""
        total = self.spec.memory_mb << 20
        used = min(IDLE_MEMORY, total)
        return {"ts": int(time.time()), "cpu_count": self.spec.cpu_count, "cpu_used_pct": 0.0,
                "mem_total": total, "mem_used": used, "mem_cache": 0,
                "mem_total_mib": total >> 20, "mem_used_mib": used >> 20,
                "disk_used": 0, "disk_total": 0}


class FakeRuntime:
    """``runtime.base.Runtime`` kept in memory."""

    name = "fake"

    def __init__(self, *, guest: bool = False) -> None:
        #: Serve envd's control endpoints in each running sandbox's slot (module docstring).
        self._guests = guest
        self._sandboxes: dict[str, _Sandbox] = {}
        self._pids = itertools.count(100_000)
        self._fail_next: AenvError | None = None
        self._fail_next_restore: AenvError | None = None
        self._fail_next_checkpoint: AenvError | None = None
        #: Seconds every boot takes (to test timeouts and concurrency).
        self.boot_delay_s = 0.0
        #: Seconds every restore takes.
        self.restore_delay_s = 0.0

    async def boot(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Same contract as ``GvisorRuntime.boot``, minus the processes."""
        self._check_start(spec, net)
        if self.boot_delay_s:
            await asyncio.sleep(self.boot_delay_s)
        if self._fail_next is not None:
            exc, self._fail_next = self._fail_next, None
            raise exc
        return await self._start(spec, net, {}, fresh=True)

    async def restore(self, image: MemoryImage, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Same contract as ``GvisorRuntime.restore``: ``spec.sandbox_id`` runs in ``net`` with
        the memory saved in ``image``.

        Prerequisites: as ``boot``; ``image`` is a complete fake image (``FailedPrecondition``
        otherwise; ``RuntimeFailure`` for files that are no fake image); ``spec`` has the saved
        sandbox's CPU count and memory size (``FailedPrecondition`` otherwise).
        On failure: nothing of the sandbox exists.
        """
        self._check_start(spec, net)
        memory = _read_image(image, spec)
        if self.restore_delay_s:
            await asyncio.sleep(self.restore_delay_s)
        if self._fail_next_restore is not None:
            exc, self._fail_next_restore = self._fail_next_restore, None
            raise exc
        return await self._start(spec, net, memory, fresh=False)

    async def precreate(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Same contract as ``GvisorRuntime.precreate``: the sandbox exists as ``created``."""
        self._check_start(spec, net)
        sandbox = _Sandbox(spec=spec, net=net, pid=next(self._pids), status="created")
        self._sandboxes[spec.sandbox_id] = sandbox
        return Instance(sandbox_id=spec.sandbox_id, runtime_id=spec.sandbox_id,
                        pid=sandbox.pid, net=net)

    async def restore_precreated(self, instance: Instance, image: MemoryImage, *,
                                 sandbox_id: str | None = None) -> Instance:
        """Same contract as ``GvisorRuntime.restore_precreated``; refuses a sandbox that is not
        ``created`` (``FailedPrecondition``) and destroys it when the restore fails."""
        sandbox = self._sandboxes.get(instance.runtime_id)
        if sandbox is None or sandbox.status != "created":
            raise FailedPrecondition(f"sandbox {instance.sandbox_id} is not pre-created")
        try:
            if sandbox_id is not None and sandbox_id != instance.sandbox_id:
                if not is_sandbox_id(sandbox_id):
                    raise InvalidArgument(f"{sandbox_id!r} is not a sandbox id")
                if self._find(sandbox_id) is not None:
                    raise AlreadyExists(f"sandbox {sandbox_id} already runs here")
                sandbox.spec = replace(sandbox.spec, sandbox_id=sandbox_id)
                instance = replace(instance, sandbox_id=sandbox_id)
            memory = _read_image(image, sandbox.spec)
            if self.restore_delay_s:
                await asyncio.sleep(self.restore_delay_s)
            if self._fail_next_restore is not None:
                exc, self._fail_next_restore = self._fail_next_restore, None
                raise exc
            sandbox.memory.clear()
            sandbox.memory.update(memory)  # in place: the guest reads and writes this dict
            if self._guests:
                sandbox.guest = await self._listen(sandbox, fresh=False)
        except BaseException:
            await self.destroy(instance)
            raise
        sandbox.status = "running"
        return instance

    async def checkpoint(self, instance: Instance, dest: Path, *, leave_running: bool
                         ) -> MemoryImage:
        """Save the sandbox's shape and memory into the new directory ``dest``.

        Prerequisites: ``dest`` does not exist (``FailedPrecondition``); the sandbox is alive,
        running or frozen (``NotFound`` otherwise).
        On success: ``dest`` holds a complete image; without ``leave_running`` the sandbox is
        ``stopped``, otherwise its status is unchanged (a frozen one stays frozen).
        On failure: ``dest`` does not exist, the sandbox is as before.
        """
        if dest.exists():
            raise FailedPrecondition(f"checkpoint destination {dest} exists already")
        sandbox = self._alive(instance.runtime_id)
        shape = _shape(sandbox.spec)
        dest.mkdir(parents=True)
        try:
            (dest / _STATE).write_text(json.dumps(
                {"format": IMAGE_FORMAT, "sandbox_id": instance.sandbox_id, **shape}))
            (dest / _PAGES_META).write_text(json.dumps({"keys": sorted(sandbox.memory)}))
            (dest / _PAGES).write_text(json.dumps(sandbox.memory, sort_keys=True))
            if self._fail_next_checkpoint is not None:
                exc, self._fail_next_checkpoint = self._fail_next_checkpoint, None
                raise exc
            image = MemoryImage.at(dest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        if not leave_running:
            sandbox.end(Exit("exited", "the sandbox's runtime exited with status 0"))
        elif sandbox.guest is not None:
            sandbox.guest.reset()  # as runsc's: the guest's TCP connections are reset
        return image

    async def freeze(self, instance: Instance) -> None:
        """Stop the sandbox's tasks: ``paused``. Refuses a frozen one (``FailedPrecondition``)
        and a dead or unknown one (``NotFound``)."""
        sandbox = self._alive(instance.runtime_id)
        if sandbox.status != "running":
            raise FailedPrecondition(f"sandbox {instance.sandbox_id} is {sandbox.status}, "
                                     "not running: cannot freeze it")
        sandbox.status = "paused"
        if sandbox.guest is not None:
            sandbox.guest.freeze()

    async def thaw(self, instance: Instance) -> None:
        """Continue a frozen sandbox: ``running``. Refuses one that is not frozen
        (``FailedPrecondition``: the real control socket would kill it) and a dead or
        unknown one (``NotFound``)."""
        sandbox = self._alive(instance.runtime_id)
        if sandbox.status != "paused":
            raise FailedPrecondition(f"sandbox {instance.sandbox_id} is {sandbox.status}, "
                                     "not paused: thawing it would kill it")
        sandbox.status = "running"
        if sandbox.guest is not None:
            sandbox.guest.thaw()

    async def stop(self, instance: Instance) -> None:
        """End the sandbox's guest; ``destroy`` forgets it."""
        sandbox = self._sandboxes.get(instance.runtime_id)
        if sandbox is not None and sandbox.status != "stopped":
            sandbox.end(Exit("killed", "the sandbox's runtime was killed by SIGKILL"))

    async def destroy(self, instance: Instance) -> None:
        """Forget the sandbox. Idempotent."""
        sandbox = self._sandboxes.pop(instance.runtime_id, None)
        if sandbox is not None:
            sandbox.end(Exit("killed", "the sandbox's runtime was killed by SIGKILL"))

    async def observe(self) -> list[Observed]:
        return [
            Observed(
                runtime_id=rid,
                sandbox_id=s.spec.sandbox_id,
                status=s.status,
                pid=s.pid if s.status != "stopped" else None,
            )
            for rid, s in self._sandboxes.items()
        ]

    async def aclose(self) -> None:
        pass

    async def image_requirements(self) -> dict[str, str]:
        return {"image_format": IMAGE_FORMAT}

    def image_complete(self, path: Path) -> bool:
        return all((path / name).is_file() for name in IMAGE_FILES)

    def saving(self, sandbox_ids: set[str]) -> bool:
        return False  # a fake checkpoint is over when its call returns

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

    def console_log(self, sandbox_id: str) -> Path | None:
        return None

    def memory_charged(self, instance: Instance) -> int | None:
        sandbox = self._sandboxes.get(instance.runtime_id)
        return None if sandbox is None else min(IDLE_MEMORY, sandbox.spec.memory_mb << 20)

    def host_tasks(self, instance: Instance) -> int | None:
        return None  # no host processes

    async def kill_guest_processes(self, instance: Instance) -> int:
        return 0

    async def wait_exit(self, instance: Instance) -> Exit:
        """Same contract as ``GvisorRuntime.wait_exit``: returns once the sandbox ended
        (``crash``, a checkpoint without ``leave_running``, ``destroy``); at once for one
        that is gone or unknown."""
        sandbox = self._sandboxes.get(instance.runtime_id)
        if sandbox is None or sandbox.pid != instance.pid:
            return Exit("exited", "the sandbox's runtime exited (status unknown)")
        await sandbox.ended.wait()
        assert sandbox.exit is not None
        return sandbox.exit

    # ---------------------------------------------------------------- internals

    def _check_start(self, spec: SandboxSpec, net: NetSlot) -> None:
        """What boot and restore refuse before anything starts."""
        sid = spec.sandbox_id
        if not is_sandbox_id(sid):
            raise InvalidArgument(f"{sid!r} is not a sandbox id (20 characters a-z0-9)")
        if not spec.rootfs.is_dir():
            raise FailedPrecondition(f"rootfs {spec.rootfs} of sandbox {sid} is not a directory")
        if spec.cpu_count < 1 or spec.memory_mb < 16:
            raise InvalidArgument("a sandbox needs at least 1 CPU and 16 MiB of memory")
        current = self._find(sid)
        if current is not None and current.status != "stopped":
            raise AlreadyExists(f"sandbox {sid} already runs here ({current.status})")
        for other_id, other in self._sandboxes.items():
            if other.net.index == net.index and other.status != "stopped" and other_id != sid:
                raise FailedPrecondition(f"slot {net.index} is used by sandbox {other_id}")

    async def _start(self, spec: SandboxSpec, net: NetSlot, memory: dict[str, str], *,
                     fresh: bool) -> Instance:
        """A running sandbox; with guests, once its guest listens (``fresh``: booted, so the
        guest makes a boot id; restored ones keep their image's)."""
        sandbox = _Sandbox(spec=spec, net=net, pid=next(self._pids), memory=memory)
        if self._guests:
            sandbox.guest = await self._listen(sandbox, fresh=fresh)
            try:
                self._check_start(spec, net)  # again: another start may have won meanwhile
            except BaseException:
                sandbox.guest.stop()
                raise
        self._sandboxes[spec.sandbox_id] = sandbox
        return Instance(sandbox_id=spec.sandbox_id, runtime_id=spec.sandbox_id,
                        pid=sandbox.pid, net=net)

    @staticmethod
    async def _listen(sandbox: _Sandbox, *, fresh: bool) -> FakeGuest:
        guest = FakeGuest(sandbox.memory, sandbox.metrics)
        await guest.start(sandbox.net, fresh=fresh)
        return guest

    def _find(self, sandbox_id: str) -> _Sandbox | None:
        """The sandbox that is ``sandbox_id`` (its runtime id differs after a resume into a
        pre-created one)."""
        found = self._sandboxes.get(sandbox_id)
        if found is not None and found.spec.sandbox_id == sandbox_id:
            return found
        return next((s for s in self._sandboxes.values() if s.spec.sandbox_id == sandbox_id),
                    None)

    def _alive(self, runtime_id: str) -> _Sandbox:
        """The running or frozen sandbox ``runtime_id``; ``NotFound`` if unknown or dead."""
        sandbox = self._sandboxes.get(runtime_id)
        if sandbox is None or sandbox.status == "stopped":
            raise NotFound(f"sandbox {runtime_id} is not running")
        return sandbox

    # ---------------------------------------------------------------- test hooks

    def crash(self, sandbox_id: str, *, out_of_memory: bool = False) -> None:
        """Make the sandbox's processes die (observe() then says ``stopped``), as a sentry
        panic would, or (``out_of_memory``) as the host's memory cgroup's OOM kill."""
        sandbox = self._find(sandbox_id)
        assert sandbox is not None, f"no sandbox {sandbox_id}"
        if out_of_memory:
            sandbox.end(Exit("out-of-memory", "out of memory: the sandbox used all its memory "
                             f"of {sandbox.spec.memory_mb} MiB and the host's memory cgroup "
                             "killed its runtime"))
        else:
            sandbox.end(Exit("crashed", "the sandbox's runtime crashed: panic: injected"))

    def remember(self, sandbox_id: str, key: str, value: str) -> None:
        """Change the guest's state, as a process inside would; a frozen guest cannot."""
        sandbox = self._alive_sandbox(sandbox_id)
        if sandbox.status != "running":
            raise FailedPrecondition(f"sandbox {sandbox_id} is {sandbox.status}")
        sandbox.memory[key] = value

    def recall(self, sandbox_id: str) -> dict[str, str]:
        """A copy of the guest's state (``NotFound`` once its processes are gone)."""
        return dict(self._alive_sandbox(sandbox_id).memory)

    def _alive_sandbox(self, sandbox_id: str) -> _Sandbox:
        found = self._find(sandbox_id)
        if found is None or found.status == "stopped":
            raise NotFound(f"sandbox {sandbox_id} is not running")
        return found

    def fail_next_boot(self, exc: AenvError) -> None:
        """Make the next boot raise ``exc`` (after its checks), leaving nothing behind."""
        self._fail_next = exc

    def fail_next_restore(self, exc: AenvError) -> None:
        """Make the next restore raise ``exc`` (after its checks), leaving nothing behind."""
        self._fail_next_restore = exc

    def fail_next_checkpoint(self, exc: AenvError) -> None:
        """Make the next checkpoint raise ``exc`` once its files are half written; ``dest`` is
        removed and the sandbox goes on as before."""
        self._fail_next_checkpoint = exc


def _shape(spec: SandboxSpec) -> dict[str, Any]:
    """What the image records of the saved sandbox's spec; a restore must match its CPUs and
    memory (runsc brings the saved kernel back as it was)."""
    return {
        "cpu_count": spec.cpu_count,
        "memory_mb": spec.memory_mb,
        "hostname": spec.hostname,
        "envd_args": list(spec.envd_args),
        "env": dict(spec.env),
    }


def _read_image(image: MemoryImage, spec: SandboxSpec) -> dict[str, str]:
    """The memory saved in ``image``, checked against ``spec``."""
    sid = spec.sandbox_id
    missing = [name for name in IMAGE_FILES if not (image.path / name).is_file()]
    if missing:
        raise FailedPrecondition(
            f"image {image.path} for sandbox {sid} is incomplete (no {', '.join(missing)})")
    try:
        state = json.loads((image.path / _STATE).read_text())
        keys = json.loads((image.path / _PAGES_META).read_text())["keys"]
        memory = json.loads((image.path / _PAGES).read_text())
        ok = (isinstance(state, dict) and state.get("format") == IMAGE_FORMAT
              and isinstance(memory, dict) and keys == sorted(memory)
              and all(isinstance(v, str) for v in memory.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeFailure(f"restore of sandbox {sid} failed: {image.path}: {exc}") from exc
    if not ok:
        raise RuntimeFailure(f"restore of sandbox {sid} failed: {image.path} is no fake image "
                             "or is torn")
    saved = {key: state.get(key) for key in ("cpu_count", "memory_mb")}
    if saved != {"cpu_count": spec.cpu_count, "memory_mb": spec.memory_mb}:
        raise FailedPrecondition(
            f"image {image.path} holds a sandbox of {saved}; sandbox {sid} asks for "
            f"{spec.cpu_count} CPUs and {spec.memory_mb} MiB")
    return {str(k): str(v) for k, v in memory.items()}
