"""The runtime driver interface: what the orchestrator needs from gVisor, Firecracker or a fake.

Drivers own processes and kernel objects of a sandbox's *execution*; they never touch the store.
The orchestrator passes in everything a driver needs (rootfs, network slot, resources) and keeps
the lifecycle truth itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from aenv.core.net import NetSlot

#: envd's port inside every sandbox.
ENVD_PORT = 49983
#: Where the envd bundle is mounted (read-only) inside every sandbox.
ENVD_MOUNT = "/opt/aenv/envd"


@dataclass(frozen=True)
class VolumeBind:
    """A host directory (a volume's mount, ``storage/volume_images.py``) bound into the sandbox."""

    source: Path
    #: Absolute path inside the sandbox.
    destination: str
    read_only: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to boot one sandbox."""

    sandbox_id: str
    #: Directory holding the merged root filesystem (prepared by storage; the driver only uses it).
    rootfs: Path
    #: The envd bundle directory on the host; mounted read-only at ENVD_MOUNT.
    envd_bundle: Path
    cpu_count: int
    memory_mb: int
    hostname: str = "sandbox"
    #: Extra arguments for envd (e.g. --user, --workdir).
    envd_args: tuple[str, ...] = ()
    #: Environment of envd itself (not of user processes; those come from /init).
    env: dict[str, str] = field(default_factory=dict)
    #: Where the root's writes go. ``memory``: a layer inside the sandbox (in every checkpoint:
    #: the normal case, see docs/lifecycle.md). ``host``: through to ``rootfs`` on the host, so
    #: the overlay's upper directory collects them — build sandboxes, whose writes become a
    #: template layer. A ``host`` sandbox is never checkpointed.
    root_writes: Literal["memory", "host"] = "memory"
    #: Volumes bound into it. A restore must be given the same destinations as the checkpoint
    #: was taken with (sources may differ: a fork child's are its own).
    volumes: tuple[VolumeBind, ...] = ()


@dataclass(frozen=True)
class Instance:
    """A running sandbox as the driver knows it; persisted by the orchestrator as opaque JSON."""

    sandbox_id: str
    #: The driver's own id (runsc container id).
    runtime_id: str
    #: Host PID of the sandbox's root process (runsc sandbox/sentry), if known.
    pid: int | None
    #: None only for orphans found on the machine that no record describes.
    net: NetSlot | None


#: The files of a runsc memory image, all three present once a checkpoint completed.
IMAGE_FILES = ("checkpoint.img", "pages_meta.img", "pages.img")


@dataclass(frozen=True)
class MemoryImage:
    """A checkpoint on disk: the sandbox's kernel state, memory and (with an in-memory root
    layer) its written files. Restorable any number of times, concurrently."""

    path: Path
    size_bytes: int

    @classmethod
    def at(cls, path: Path) -> MemoryImage:
        """The complete image in ``path``; ``FileNotFoundError`` if a file is missing."""
        return cls(path, sum((path / name).stat().st_size for name in IMAGE_FILES))


@dataclass(frozen=True)
class Stats:
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


@dataclass(frozen=True)
class Observed:
    """A sandbox the driver finds on the machine (for recovery after a server restart)."""

    runtime_id: str
    sandbox_id: str
    #: "running" | "paused" | "stopped" | "created" | "unknown", or "in-doubt": a pause or
    #: resume was cut short and the driver cannot tell which (alive, to be checkpointed).
    status: str
    pid: int | None


@dataclass(frozen=True)
class Exit:
    """How a sandbox's runtime ended, as far as the driver can tell."""

    #: ``out-of-memory`` (the host's memory cgroup killed it), ``pids-limit`` (it reached its
    #: host pids limit, e.g. a fork bomb), ``killed`` (a signal from outside), ``crashed``
    #: (the runtime's own failure, e.g. a sentry panic) or ``exited``
    #: (it ended by itself: a checkpoint without ``leave_running``, a destroy, init's exit).
    cause: str
    #: One line for people, e.g. "out of memory: the sandbox used its 256 MiB".
    message: str


class Runtime(Protocol):
    name: str

    async def boot(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Cold-start a sandbox whose envd listens on ``net.guest_ip:ENVD_PORT``.

        Prerequisites: ``spec.rootfs`` exists; ``net`` is a prepared, unused slot.
        On success: the sandbox's init (envd) has been started; readiness is the caller's check.
        On failure: nothing of the sandbox is left running; raises ``RuntimeFailure``.
        """
        ...

    async def restore(self, image: MemoryImage, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Start a sandbox from ``image`` as ``spec.sandbox_id`` in ``net``.

        Prerequisites: as ``boot``; ``spec`` has the checkpointed sandbox's envd bundle and
        shape; ``net`` is a fresh slot (guest address and MAC are the same in every slot).
        On success: the sandbox runs where it was saved (processes, memory, files); guest TCP
        connections open at the checkpoint are reset. On failure: as ``boot``.
        """
        ...

    async def precreate(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Pay a restore's fixed start-up ahead: the sandbox ``spec`` describes, created in
        ``net`` but not started, for a later ``restore_precreated``.

        Prerequisites: as ``boot``. On success: an ``Instance`` that runs nothing yet (it costs
        its runtime's idle processes); ``destroy`` releases it. On failure: as ``boot``.
        """
        ...

    async def restore_precreated(self, instance: Instance, image: MemoryImage, *,
                                 sandbox_id: str | None = None) -> Instance:
        """Start the sandbox ``precreate`` made from ``image``, in the slot and rootfs it was
        created with; as ``sandbox_id`` when given (a resume: the sandbox's id is fixed, the
        pre-created one's is not), else as the id it was created as.

        Prerequisites: ``instance`` came from ``precreate`` and was not restored yet; ``image``
        was saved by a sandbox of the same shape (envd bundle, mounts, CPUs, memory); no other
        sandbox of ``sandbox_id`` runs here.
        On success: as ``restore``; the instance has ``sandbox_id`` and keeps its
        ``runtime_id`` (a driver whose files of a sandbox are kept by sandbox id moves them,
        unless someone moved them already; ``observe`` reports it under ``sandbox_id``).
        On failure: raises ``RuntimeFailure``; the instance is destroyed (its slot and
        rootfs stay the caller's).
        """
        ...

    async def checkpoint(self, instance: Instance, dest: Path, *, leave_running: bool
                         ) -> MemoryImage:
        """Save the sandbox into ``dest`` (must not exist). ``leave_running``: the sandbox
        goes on afterwards (its guest TCP connections reset); otherwise it exits.
        On failure: ``dest`` is removed, the sandbox is as before; raises ``RuntimeFailure``.
        """
        ...

    async def freeze(self, instance: Instance) -> None:
        """Stop every task of the sandbox; memory stays resident."""
        ...

    async def thaw(self, instance: Instance) -> None:
        """Continue a frozen sandbox."""
        ...

    async def stop(self, instance: Instance) -> None:
        """Kill every process of the sandbox now, without waiting for them or releasing
        anything: from its return nothing of the sandbox runs or writes. Milliseconds (no
        runtime CLI); ``destroy`` still follows. Idempotent; an unknown sandbox is fine."""
        ...

    async def destroy(self, instance: Instance) -> None:
        """Kill every process of the sandbox and release the driver's state. Idempotent."""
        ...

    async def observe(self) -> list[Observed]:
        """Every sandbox this driver has on the machine, as it sees them now."""
        ...

    async def stats(self, instance: Instance) -> Stats: ...

    def memory_charged(self, instance: Instance) -> int | None:
        """Bytes the host charges the running sandbox for memory now (what a memory image of
        it can take at most), or None when the driver cannot tell."""
        ...

    def host_tasks(self, instance: Instance) -> int | None:
        """Host tasks (threads) the running sandbox's runtime has now, counted against its
        host pids limit, or None when the driver cannot tell."""
        ...

    async def kill_guest_processes(self, instance: Instance) -> int:
        """SIGKILL every process in the guest but its init (envd), at once (a runaway:
        a fork bomb); how many were signalled. The sandbox keeps running. Refuses a frozen
        sandbox (``FailedPrecondition``) or one whose pause is in doubt (``InDoubt``)."""
        ...

    def console_log(self, sandbox_id: str) -> Path | None:
        """The file the sandbox's init (envd) writes its stdout and stderr to, appended to
        across restores, while the sandbox has a runtime; None when the driver keeps none."""
        ...

    async def image_requirements(self) -> dict[str, str]:
        """What a memory image this driver saves needs of the host that restores it (its
        build, platform, medium …), beyond the CPU's features: recorded in every manifest with
        an image and compared key by key, exactly, before a restore on another node."""
        ...

    def image_complete(self, path: Path) -> bool:
        """Does ``path`` hold every file of a finished checkpoint (recovery's test of an image
        a crash may have cut short)?"""
        ...

    def saving(self, sandbox_ids: set[str]) -> bool:
        """Is a checkpoint started before this process (a server killed mid-save) still
        writing the image of one of ``sandbox_ids``? Recovery waits for it to end."""
        ...

    async def aclose(self) -> None:
        """Release what the driver holds on the host for all its sandboxes (at node stop;
        sandboxes still running keep what they use)."""
        ...

    async def wait_exit(self, instance: Instance) -> Exit:
        """Wait until the sandbox's runtime has exited, for whatever reason (a checkpoint
        without ``leave_running`` and ``destroy`` too: the caller tells those apart), and say
        why. Returns at once for a runtime that is gone already; cancellable.
        Prerequisites: ``instance`` was booted or restored by this driver (on this machine;
        the server may have restarted since). Read the reason before ``destroy``: it erases
        what the reason is read from.
        """
        ...
