"""The gVisor driver: one runsc sandbox per aenv sandbox, envd as its init.

Layout under ``state_dir`` (``<AENV_HOME>/sandboxes`` in a node)::

    runsc/                      runsc --root (ours alone; never the default /var/run/runsc)
    <sandbox_id>/bundle/        config.json, etc/{hosts,hostname,resolv.conf}, sandbox.pid,
                                container-id (runsc's id of the sandbox)
    <sandbox_id>/logs/          runsc debug logs (run, boot, gofer) and console.log (envd's
                                stdout/stderr and runsc's own errors)

The runsc container id is the sandbox id (E2B ids are 20 characters, and a fixed length keeps
runsc's prefix matching of ids from ever confusing two sandboxes), except for a sandbox resumed
into a pre-created one: runsc's id of that is the pre-created sandbox's, which cannot change, and
its files move to the resumed sandbox's directory; ``container-id`` says which is which.

A booted sandbox does not depend on the process that booted it: runsc's sandbox and gofer
processes run in their own sessions, adopted by the node (its subreaper: ``reaper.py``; init
once the node is gone), in their own cgroups
(``<cgroup_parent>/<sandbox_id>``), so they survive a ``kill -9`` of the server; ``observe()``
finds them again through ``runsc list``.

Owns: the sandbox's runsc container, its cgroups, bundle and logs. Must not touch: the rootfs
(storage mounts and unmounts it), the network slot (the pool creates and destroys it), the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from aenv.core import ids
from aenv.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from aenv.core.net import NetSlot
from aenv.runtime import (
    cgroups,
    exits,
    gvisor_images,
    gvisor_pause,
    gvisor_tasks,
    gvisor_teardown,
    oci,
)
from aenv.runtime.base import (
    Exit,
    Instance,
    MemoryImage,
    Observed,
    SandboxSpec,
    Stats,
)
from aenv.runtime.gvisor_checkpoint import checkpoint_over_socket
from aenv.runtime.gvisor_stats import StatsSampler
from aenv.runtime.runsc import RUNSC, Runsc, RunscConfig, map_runsc_errors
from aenv.runtime.slot_filler import SlotFiller

log = logging.getLogger("aenv.runtime.gvisor")

#: sun_path holds 108 bytes, NUL included.
MAX_SOCKET_PATH = 107
#: runsc's statuses, as the orchestrator's Observed.status spells them.
_STATUSES = {"created", "running", "paused", "stopped"}
_ALIVE = {"created", "running", "paused"}
#: How often ``wait_exit`` asks runsc about a sandbox whose pid it does not know.
STATE_POLL_S = 1.0


@dataclass(frozen=True)
class GvisorConfig:
    """Node-level settings of the driver (the integrator maps them from ``Settings``)."""

    #: Bundles, logs and runsc's state live here (see the module docstring). Keep it short:
    #: runsc's control sockets, ``<state_dir>/runsc/runsc-<id>.sock``, must fit 107 bytes.
    state_dir: Path
    runsc: Path = RUNSC
    platform: str = "systrap"
    #: See ``RunscConfig.overlay2``: ``root:memory`` keeps written files inside checkpoints.
    overlay2: str = "root:memory"
    #: A tmpfs at /tmp inside every sandbox (for ``overlay2="none"``: see ``oci.sandbox_config``).
    tmp_in_memory: bool = False
    #: Host cgroup under which each sandbox gets ``<sandbox_id>`` (every v1 controller).
    cgroup_parent: str = "/aenv"
    limits: oci.Limits = field(default_factory=oci.Limits)
    #: Name servers written to the sandbox's /etc/resolv.conf; empty keeps the image's file.
    dns_servers: tuple[str, ...] = ("8.8.8.8", "1.1.1.1")
    net_raw: bool = False
    #: Keep ``<sandbox_id>/logs`` after destroy (debugging); otherwise it goes with the rest.
    keep_logs: bool = False
    extra_runsc_flags: tuple[str, ...] = ()


class GvisorRuntime:
    """``runtime.base.Runtime`` on gVisor's runsc."""

    name = "gvisor"

    def __init__(self, config: GvisorConfig) -> None:
        socket_path = config.state_dir / "runsc" / f"runsc-{'x' * ids.SANDBOX_ID_LEN}.sock"
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            raise InvalidArgument(f"state_dir {config.state_dir} is too long for runsc's sockets")
        self.config = config
        self.runsc = Runsc(
            RunscConfig(
                root=config.state_dir / "runsc",
                binary=config.runsc,
                platform=config.platform,
                overlay2=config.overlay2,
                net_raw=config.net_raw,
                extra_flags=config.extra_runsc_flags,
            )
        )
        self._stats = StatsSampler(self.runsc, self.bundle_dir)
        self._slot_filler = SlotFiller(config.state_dir / "slot-filler")

    async def aclose(self) -> None:
        """Release what the driver mounted on the host (running sandboxes keep theirs)."""
        await self._slot_filler.remove()

    # ---------------------------------------------------------------- paths

    def sandbox_dir(self, sandbox_id: str) -> Path:
        return self.config.state_dir / sandbox_id

    def bundle_dir(self, sandbox_id: str) -> Path:
        return self.sandbox_dir(sandbox_id) / "bundle"

    def log_dir(self, sandbox_id: str) -> Path:
        return self.sandbox_dir(sandbox_id) / "logs"

    def console_log(self, sandbox_id: str) -> Path:
        """envd's stdout/stderr and runsc's errors at start."""
        return self.log_dir(sandbox_id) / "console.log"

    # ---------------------------------------------------------------- Runtime

    async def boot(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Cold-start a sandbox whose envd listens on ``net.guest_ip:ENVD_PORT``.

        Prerequisites: ``spec.sandbox_id`` is an E2B id unused on this node; ``spec.rootfs``
        is a directory only this sandbox uses; ``spec.envd_bundle`` holds ``bin/envd`` and
        never changes while the sandbox runs (a rebuilt bundle must get a new path); ``net``
        is a prepared slot no sandbox used before.
        On success: runsc runs the sandbox detached from us, envd is its init process (whether
        it listens yet is the caller's check); returns its ``Instance``. ~0.2-0.3 s.
        On failure: nothing of the sandbox is left (container, cgroups, bundle); raises
        ``InvalidArgument``/``FailedPrecondition`` for a bad spec, ``AlreadyExists`` when the
        id runs already, ``RuntimeFailure`` when runsc fails (with its log's tail).
        """
        return await self._start(spec, net, None)

    async def restore(self, image: MemoryImage, spec: SandboxSpec, net: NetSlot) -> Instance:
        """Start ``spec.sandbox_id`` from ``image`` in ``net`` (see ``Runtime.restore``).

        The bundle is written afresh for this id and slot; the container name and mounts
        are the same as at boot, which is what runsc matches saved host FDs by.
        ~0.3-0.4 s, CPU-bound (seccomp filters, decoding kernel objects).
        """
        return await self._start(spec, net, image)

    async def precreate(self, spec: SandboxSpec, net: NetSlot) -> Instance:
        """``runsc create`` of ``spec`` in ``net`` (see ``Runtime.precreate``): the sandbox and
        gofer processes run, waiting; ~100 ms, paid before any request needs it."""
        return await self._start(spec, net, None, create_only=True)

    async def restore_precreated(self, instance: Instance, image: MemoryImage, *,
                                 sandbox_id: str | None = None) -> Instance:
        """``runsc restore -detach`` into the container ``precreate`` made (see
        ``Runtime.restore_precreated``): ~95 ms instead of ~180 ms for a fresh restore.

        As another ``sandbox_id``, the bundle and logs move to that id's directory, and the
        rootfs path in ``config.json`` follows where it names the old id as a directory (the
        caller moved the rootfs so). runsc keeps the container under its id, with its stale
        bundle path (only ``observe`` reads that: it goes by ``container-id``)."""
        sid = sandbox_id or instance.sandbox_id
        try:
            if sid != instance.sandbox_id:
                if not ids.is_sandbox_id(sid):
                    raise InvalidArgument(f"{sid!r} is not a sandbox id")
                await asyncio.to_thread(self._move, instance.sandbox_id, sid)
                instance = replace(instance, sandbox_id=sid)
        except BaseException:
            await asyncio.shield(self._remove(instance.runtime_id, instance.sandbox_id,
                                              keep_logs=self.config.keep_logs))
            raise
        bundle, logs = self.bundle_dir(sid), self.log_dir(sid)
        try:
            with map_runsc_errors(sid, "restore", log=self.console_log(sid)):
                await self.runsc.restore_detached(
                    instance.runtime_id, bundle, image.path, log_dir=logs,
                    console=self.console_log(sid), pid_file=bundle / "sandbox.pid",
                )
        except BaseException:
            await asyncio.shield(self._remove(instance.runtime_id, sid,
                                              keep_logs=self.config.keep_logs))
            raise
        log.info("restored sandbox %s (pid %s) into pre-created sandbox %s", sid, instance.pid,
                 instance.runtime_id)
        return instance

    def _move(self, old: str, new: str) -> None:
        """The driver's files of sandbox ``old`` become ``new``'s (see restore_precreated)."""
        src, dst = self.sandbox_dir(old), self.sandbox_dir(new)
        if (dst / "bundle").exists() and (src / "bundle").exists():
            raise FailedPrecondition(f"sandbox {new} has a bundle here already")
        dst.mkdir(parents=True, exist_ok=True)
        for name in ("bundle", "logs"):
            if (src / name).exists():
                (src / name).rename(dst / name)
        with contextlib.suppress(OSError):
            src.rmdir()
        self._pause_marker(new).unlink(missing_ok=True)
        # The rootfs's directory is keyed by id too (storage's: the node swapped it already);
        # only ``_shape`` reads the path back, for the disk statistics.
        config = oci.read_config(self.bundle_dir(new))
        root = str(config["root"]["path"])
        if f"/{old}/" in root:
            config["root"]["path"] = root.replace(f"/{old}/", f"/{new}/")
            oci.write_config(self.bundle_dir(new), config)

    async def checkpoint(self, instance: Instance, dest: Path, *, leave_running: bool
                         ) -> MemoryImage:
        """Save the sandbox into the new directory ``dest`` (see ``Runtime.checkpoint``)."""
        sid = instance.sandbox_id
        try:
            dest.mkdir(parents=True)
        except FileExistsError as exc:
            raise FailedPrecondition(f"checkpoint destination {dest} already exists") from exc
        try:
            if leave_running:
                await checkpoint_over_socket(self.runsc, instance, dest)
            else:
                with map_runsc_errors(sid, "checkpoint", log=self.console_log(sid)):
                    await self.runsc.checkpoint(instance.runtime_id, dest, leave_running=False,
                                                console=self.console_log(sid))
            return MemoryImage.at(dest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise

    async def freeze(self, instance: Instance) -> None:
        """Stop every task of the sandbox over its control socket (< 1 ms), the truth kept in
        its ``pause-state`` marker (``runtime/gvisor_pause.py``). Refuses a frozen sandbox
        (``FailedPrecondition``) and raises ``InDoubt`` for one in doubt."""
        await gvisor_pause.freeze(self.runsc, instance.runtime_id, instance.sandbox_id,
                                  self._pause_marker(instance.sandbox_id))

    async def thaw(self, instance: Instance) -> None:
        """Continue a sandbox ``freeze`` stopped (``runtime/gvisor_pause.py``); refuses one it
        did not stop (``FailedPrecondition``) or whose pause is in doubt (``InDoubt``)."""
        await gvisor_pause.thaw(self.runsc, instance.runtime_id, instance.sandbox_id,
                                self._pause_marker(instance.sandbox_id))

    def _pause_marker(self, sandbox_id: str) -> Path:
        return self.sandbox_dir(sandbox_id) / gvisor_pause.MARKER

    async def destroy(self, instance: Instance) -> None:
        """Kill every process of the sandbox and remove its runsc state, cgroups, bundle and
        logs. Idempotent.

        Prerequisites: none (an unknown or already destroyed sandbox is fine). ``instance.net``
        is not used: the slot is the pool's to release.
        On success: no process, cgroup, runsc state or bundle of the sandbox remains. Takes
        ~0.1 s (1.1 s on this machine, whose PID 1 reaps orphans slowly).
        On failure: raises ``RuntimeFailure``; call again.
        """
        await self._remove(instance.runtime_id, instance.sandbox_id,
                           keep_logs=self.config.keep_logs)

    async def stop(self, instance: Instance) -> None:
        """SIGKILL what is in the sandbox's cgroup (the sandbox process, gVisor's kernel, with
        it every guest process): nothing of it runs after this. By cgroup, not by the pid
        recorded at start, which may have been reused since. ``destroy`` then finds it
        dead: runsc deletes a dead sandbox as a live one, without the wait for it to exit."""
        cgroups.kill_left(self._cgroup(instance.runtime_id))

    async def observe(self) -> list[Observed]:
        """Every sandbox under our runsc root, as runsc sees it now.

        On success: one ``Observed`` per container; ``status`` is runsc's (created, running,
        paused, stopped) or ``unknown``; a sandbox whose processes died shows ``stopped``.
        On failure: raises ``RuntimeFailure``.
        """
        with map_runsc_errors("(all)", "list"):
            states = await self.runsc.list()
        # A sandbox resumed into a pre-created one: its bundle moved, runsc's path is stale.
        homes = await asyncio.to_thread(self._homes)
        found = []
        for st in states:
            sandbox_id = homes.get(st.id) or (
                st.bundle.parent.name if st.bundle.name == "bundle" else st.id)
            status = st.status if st.status in _STATUSES else "unknown"
            if status in _ALIVE and st.pid is not None and not gvisor_teardown.pid_alive(st.pid):
                # A sandbox that exited after a checkpoint keeps "running" in runsc's file.
                status = "stopped"
            if status == "running":
                status = gvisor_pause.observed_status(self._pause_marker(sandbox_id)) or status
            found.append(Observed(runtime_id=st.id, sandbox_id=sandbox_id, status=status,
                                  pid=st.pid))
        return found

    def _homes(self) -> dict[str, str]:
        """runsc id → sandbox id, from every bundle's ``container-id``."""
        homes = {}
        for path in self.config.state_dir.glob("*/bundle/container-id"):
            with contextlib.suppress(OSError):
                homes[path.read_text().strip()] = path.parent.parent.name
        return homes

    async def stats(self, instance: Instance) -> Stats:
        """CPU, memory and disk of a running sandbox (``gvisor_stats.py``).
        Prerequisites: the sandbox runs. On failure: ``NotFound`` (gone), ``RuntimeFailure``."""
        return await self._stats.sample(instance)

    async def image_requirements(self) -> dict[str, str]:
        return await gvisor_images.requirements(self.config.runsc, self.config.platform,
                                                self.config.overlay2)

    def image_complete(self, path: Path) -> bool:
        return gvisor_images.complete(path)

    def saving(self, sandbox_ids: set[str]) -> bool:
        return gvisor_images.checkpoint_running(sandbox_ids)

    async def wait_exit(self, instance: Instance) -> Exit:
        """Wait until the sandbox's runsc sandbox process (the sentry) exits; say why.

        Noticed through a pidfd within milliseconds (``runtime/exits.py``; polled where pidfds
        are unavailable, or ``runsc state`` each ``STATE_POLL_S`` when the pid is unknown).
        The reason, most specific first: the sandbox's memory cgroup counted an OOM kill →
        ``out-of-memory``; a Go panic in the sandbox's runsc logs → ``crashed``; the wait
        status: a signal → ``killed``, else ``exited``.
        Prerequisites: none (a sandbox gone already returns at once). Call before
        ``destroy``, which removes the cgroup and logs the reason is read from.
        """
        sid = instance.sandbox_id
        status: int | None = None
        if instance.pid is not None:
            status = await exits.wait_exit(instance.pid,
                                           cmdline_has=instance.runtime_id.encode())
        else:
            while True:
                try:
                    with map_runsc_errors(sid, "state"):
                        state = await self.runsc.state(instance.runtime_id)
                except NotFound:
                    break
                if state.status not in _ALIVE or (state.pid is not None
                                                  and not gvisor_teardown.pid_alive(state.pid)):
                    break
                await asyncio.sleep(STATE_POLL_S)
        logs = self.log_dir(sid)
        return exits.reason(
            status, cgroup=self._cgroup(instance.runtime_id),
            logs=[*sorted(logs.glob("*boot*")), self.console_log(sid)],
        )

    # ---------------------------------------------------------------- internals

    async def _start(self, spec: SandboxSpec, net: NetSlot, image: MemoryImage | None, *,
                     create_only: bool = False) -> Instance:
        sid = spec.sandbox_id
        if not ids.is_sandbox_id(sid):
            raise InvalidArgument(f"{sid!r} is not a sandbox id (20 characters a-z0-9)")
        if image is not None and spec.root_writes == "host":
            raise InvalidArgument("a sandbox writing its root on the host cannot be restored")
        if not spec.rootfs.is_dir():
            raise FailedPrecondition(f"rootfs {spec.rootfs} of sandbox {sid} is not a directory")
        if not (spec.envd_bundle / "bin" / "envd").is_file():
            raise FailedPrecondition(f"{spec.envd_bundle} is not an envd bundle (no bin/envd)")
        if not Path(net.netns_path).exists():
            raise FailedPrecondition(f"network namespace {net.netns_path} does not exist")
        await self._clear_leftover(sid)
        self._pause_marker(sid).unlink(missing_ok=True)  # a new sandbox is never paused

        bundle, logs = self.bundle_dir(sid), self.log_dir(sid)
        try:
            self._prepare_bundle(spec, net, await self._slot_filler.ensure())
            logs.mkdir(parents=True, exist_ok=True)
            pid_file = bundle / "sandbox.pid"
            action = "create" if create_only else "run" if image is None else "restore"
            with map_runsc_errors(sid, action, log=self.console_log(sid)):
                if create_only:
                    await self.runsc.create(sid, bundle, log_dir=logs,
                                            console=self.console_log(sid), pid_file=pid_file)
                elif image is None:
                    await self.runsc.run_detached(
                        sid, bundle, log_dir=logs, console=self.console_log(sid),
                        pid_file=pid_file,
                        overlay2="none" if spec.root_writes == "host" else None,
                    )
                else:
                    await self.runsc.restore_detached(
                        sid, bundle, image.path, log_dir=logs, console=self.console_log(sid),
                        pid_file=pid_file,
                    )
            pid = _read_pid(pid_file)
        except BaseException:
            await asyncio.shield(self._remove(sid, sid, keep_logs=self.config.keep_logs))
            raise
        done = "created" if create_only else "booted" if image is None else "restored"
        log.info("%s sandbox %s (pid %s) in slot %d", done, sid, pid, net.index)
        return Instance(sandbox_id=sid, runtime_id=sid, pid=pid, net=net)

    def _prepare_bundle(self, spec: SandboxSpec, net: NetSlot, slot_filler: Path) -> None:
        bundle = self.bundle_dir(spec.sandbox_id)
        c = self.config
        oci.write_bundle(bundle, spec, net, dns_servers=c.dns_servers, limits=c.limits,
                         cgroups_path=f"{c.cgroup_parent.rstrip('/')}/{spec.sandbox_id}",
                         net_raw=c.net_raw, tmp_in_memory=c.tmp_in_memory,
                         slot_filler=slot_filler)
        (bundle / "container-id").write_text(spec.sandbox_id)

    async def _clear_leftover(self, sid: str) -> None:
        """Refuse a running namesake; remove a dead one's state so the id can boot again."""
        if not self.bundle_dir(sid).exists():
            # The bundle is written before runsc runs and removed after runsc forgot the id:
            # without one there is nothing to clear (and no runsc call to pay for).
            return
        try:
            runtime_id = (self.bundle_dir(sid) / "container-id").read_text().strip() or sid
        except OSError:
            runtime_id = sid
        try:
            with map_runsc_errors(sid, "state"):
                state = await self.runsc.state(runtime_id)
        except NotFound:
            state = None
        if state is not None and state.status in _ALIVE:
            raise AlreadyExists(f"sandbox {sid} already runs here ({state.status})")
        await self._remove(runtime_id, sid, keep_logs=False)

    async def _remove(self, runtime_id: str, sid: str, *, keep_logs: bool) -> None:
        """Remove runsc's container ``runtime_id`` and its cgroups, and the files of sandbox
        ``sid`` (the same id but for a sandbox resumed into a pre-created one)."""
        with map_runsc_errors(sid, "delete"):
            await gvisor_teardown.delete(self.runsc, self.config.state_dir, runtime_id,
                                         _read_pid(self.bundle_dir(sid) / "sandbox.pid"))
        # runsc creates the cgroups before it saves the container's state, so a run that
        # fails (or is cancelled) in between leaves cgroups that ``delete`` does not know
        # about, with the processes it started in them.
        await gvisor_teardown.kill_left(self._cgroup(runtime_id), runtime_id)
        cgroups.remove(self._cgroup(runtime_id))
        self._stats.forget(runtime_id)
        sandbox_dir = self.sandbox_dir(sid)
        self._pause_marker(sid).unlink(missing_ok=True)
        # Only what the driver made: the rootfs (storage's) may live in the same directory.
        shutil.rmtree(self.bundle_dir(sid), ignore_errors=True)
        if not keep_logs:
            shutil.rmtree(self.log_dir(sid), ignore_errors=True)
        try:
            sandbox_dir.rmdir()
        except OSError:
            pass  # not empty (storage's upper, kept logs) or already gone

    def memory_charged(self, instance: Instance) -> int | None:
        """Bytes the sandbox's memory cgroup is charged now (guest memory and the files
        written into it; a memory image holds at most that), None if unknown."""
        return cgroups.memory_charged(self._cgroup(instance.runtime_id))

    def host_tasks(self, instance: Instance) -> int | None:
        """Tasks in the sandbox's host pids cgroup (sentry, gofer, ptrace stubs)."""
        return cgroups.tasks(self._cgroup(instance.runtime_id))

    async def kill_guest_processes(self, instance: Instance) -> int:
        """Every guest process but envd SIGKILLed, the guest frozen meanwhile
        (``runtime/gvisor_tasks.py``)."""
        return await gvisor_tasks.kill_all_but_init(
            self.runsc, instance.runtime_id, instance.sandbox_id,
            self._pause_marker(instance.sandbox_id))

    def _cgroup(self, sandbox_id: str) -> str:
        return f"{self.config.cgroup_parent.strip('/')}/{sandbox_id}"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
