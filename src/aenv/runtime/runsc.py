"""The one wrapper around the ``runsc`` CLI (gVisor 20240729), and its error boundary.

Every runsc call of aenv goes through :class:`Runsc`, itself through ``core.proc``, with our own
``--root`` (never the default ``/var/run/runsc``, which other runsc users on the node share).
``map_runsc_errors`` turns a failed call into a domain error: ``NotFound`` when runsc does not
know the container, ``RuntimeFailure`` otherwise, with runsc's own words in the message.

Two measured quirks shape ``run_detached`` (measured on these hosts; docs/lifecycle.md):

* ``--network=sandbox`` refuses to start on kernel 6.18 ("cannot run with network enabled in
  root network namespace": its check looks for a sysctl file that now exists in every netns).
  The CLI therefore runs as ``unshare -m --propagation slave sh -c 'mount -t tmpfs none
  /proc/sys/net && exec runsc …'``. The sandbox and gofer pivot into roots of their own, so
  no long-lived process keeps that mount namespace (checked: their mountinfo holds no
  ``/run/netns`` entry); *slave* rather than private still lets host unmounts reach it while
  the CLI runs.
* A detached sandbox inherits the CLI's stdio. Were they pipes, ``proc.run`` would wait for EOF
  until the sandbox exits; they are ``/dev/null`` and a log file instead, which also captures
  envd's own stdout/stderr.

Owns: runsc invocations and their flags. Must not touch: bundles, slots, cgroup files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.core import proc
from aenv.core.errors import CommandError, CommandTimeout, InDoubt, NotFound, RuntimeFailure

RUNSC = Path("/usr/bin/runsc")

#: ``run -detach`` measured 110-330 ms; a cold page cache, seccomp filter builds (~31 ms each)
#: and a busy 2-core node can stretch that to seconds. Beyond a minute something is stuck.
RUN_TIMEOUT_S = 60.0
#: state/list/kill/events answer in ~25 ms (one urpc round trip per sandbox).
QUERY_TIMEOUT_S = 15.0
#: ``delete --force`` SIGKILLs the sandbox and polls (100 ms steps) until it is reaped; this
#: machine's PID 1 reaps orphans only about once a second (1.1 s measured).
DELETE_TIMEOUT_S = 30.0
#: Default for ``exec`` (tests and diagnostics).
EXEC_TIMEOUT_S = 60.0

#: What runsc prints when it has no such container (state file missing).
_NOT_FOUND = re.compile(
    r"loading (container|sandbox)[^:\n]*: (file does not exist|open [^\n]*: no such file)"
)
#: The shell that ``unshare`` runs: hide /proc/sys/net, then become runsc with our stdio.
#: Positional args: $1 = output file, $2… = the runsc argv (no quoting games).
_NETNS_WORKAROUND = (
    'out="$1"; shift; mount -t tmpfs none /proc/sys/net && exec "$@" </dev/null >>"$out" 2>&1'
)


@dataclass(frozen=True)
class RunscConfig:
    """Flags shared by every runsc call of one driver."""

    #: runsc's state directory (``--root``); ours alone.
    root: Path
    binary: Path = RUNSC
    #: systrap: no KVM needed (and /dev/kvm here is nested PVM, which gVisor cannot use).
    platform: str = "systrap"
    network: str = "sandbox"
    #: ``root:memory``: the root's writable layer lives in the sandbox's memory, so every
    #: checkpoint holds memory and files of one instant (a fork child restored from it sees
    #: exactly what the parent saw). ``none`` writes through to the rootfs directory instead.
    overlay2: str = "root:memory"
    #: Raw sockets (ping) inside sandboxes; off by default like runsc itself.
    net_raw: bool = False
    extra_flags: tuple[str, ...] = ()

    def global_flags(self, *, overlay2: str | None = None) -> list[str]:
        flags = [
            f"--root={self.root}",
            f"--platform={self.platform}",
            f"--network={self.network}",
            f"--overlay2={overlay2 or self.overlay2}",
            # The guest sees as many CPUs as its quota allows (not the host's count).
            "--cpu-num-from-quota",
            # Our bind mounts (the envd bundle, /etc files) never change under a running
            # sandbox, so the sentry may cache them instead of revalidating every lookup: envd
            # starts ~10% faster (its ~400 module imports are lookups).
            "--file-access-mounts=exclusive",
            # Without it a checkpoint is refused while any guest TCP connection is open (or in
            # TIME-WAIT); with it the save resets them. Read when links are made: run, restore.
            "--net-disconnect-ok",
        ]
        if self.net_raw:
            flags.append("--net-raw")
        return [*flags, *self.extra_flags]


@dataclass(frozen=True)
class ContainerState:
    """One container as ``runsc state``/``list`` reports it."""

    id: str
    #: created | running | paused | stopped
    status: str
    pid: int | None
    bundle: Path
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ContainerState:
        pid = data.get("pid")
        return cls(
            id=str(data["id"]),
            status=str(data.get("status", "unknown")),
            pid=pid if isinstance(pid, int) and pid > 0 else None,
            bundle=Path(str(data.get("bundle", ""))),
            raw=dict(data),
        )


@contextmanager
def map_runsc_errors(sandbox_id: str, action: str, *, log: Path | None = None) -> Iterator[None]:
    """Convert a failed runsc call into ``NotFound`` or ``RuntimeFailure`` (chained).

    ``log``: a file whose tail explains the failure better than stderr (the console log of a
    detached ``run``). Cancellation and non-command errors pass through untouched.
    """
    try:
        yield
    except CommandTimeout as exc:
        # Killed at its timeout: whether it took effect is unknown.
        raise InDoubt(
            f"runsc {action} of sandbox {sandbox_id} did not finish: {exc.stderr.strip()}"
        ) from exc
    except CommandError as exc:
        words = exc.stderr.strip()
        if log is not None:
            words = "\n".join(filter(None, [words, _tail(log)]))
        if _NOT_FOUND.search(words):
            raise NotFound(f"sandbox {sandbox_id} is not known to runsc") from exc
        raise RuntimeFailure(
            f"runsc {action} of sandbox {sandbox_id} failed ({exc.returncode}): "
            f"{words[-1500:] or 'no output'}"
        ) from exc


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _in_net_workaround(output: Path, runsc: Sequence[str]) -> list[str]:
    """``runsc`` under the /proc/sys/net workaround, stdio to /dev/null and ``output``."""
    return ["unshare", "-m", "--propagation", "slave", "--", "sh", "-c", _NETNS_WORKAROUND,
            "sh", str(output), *runsc]


class Runsc:
    """runsc subcommands, one method each; raw ``CommandError`` escapes (wrap the call site
    in ``map_runsc_errors``)."""

    def __init__(self, config: RunscConfig) -> None:
        self.config = config

    def _argv(self, *args: str) -> list[str]:
        return [str(self.config.binary), *self.config.global_flags(), *args]

    def control_socket(self, sandbox_id: str) -> Path:
        """The sandbox's urpc socket (``runtime/urpc.py``); the runsc sandbox id is the
        container id of its first container, which is ours."""
        return self.config.root / f"runsc-{sandbox_id}.sock"

    async def run_detached(
        self, container_id: str, bundle: Path, *, log_dir: Path, console: Path, pid_file: Path,
        overlay2: str | None = None,
    ) -> None:
        """``runsc run -detach``: create and start the sandbox, return once it runs.

        Prerequisites: ``bundle/config.json`` exists; its network namespace exists.
        On success: the sandbox and gofer run in their own sessions (not our children: they
        survive us); their pid is in ``pid_file``; debug logs go to ``log_dir/``; the
        container's stdout/stderr and runsc's own errors are appended to ``console``.
        ``overlay2`` overrides the configured root overlay for this sandbox (``none``: writes
        go through to the rootfs directory).
        On failure: raises ``CommandError`` (details in ``console``); a half-created container
        may remain (``delete --force`` it).
        """
        runsc = [
            str(self.config.binary),
            *self.config.global_flags(overlay2=overlay2),
            # A trailing slash: one file per runsc command (run, boot, gofer) in the directory.
            f"--debug-log={log_dir}/",
            "run",
            "-detach",
            f"-bundle={bundle}",
            f"-pid-file={pid_file}",
            container_id,
        ]
        await proc.run(_in_net_workaround(console, runsc), timeout=RUN_TIMEOUT_S)

    async def create(
        self, container_id: str, bundle: Path, *, log_dir: Path, console: Path, pid_file: Path,
    ) -> None:
        """``runsc create``: the sandbox and gofer processes started, the container not.

        What this pays ahead (~100 ms here: the CLI, the gofer, the sandbox re-exec'ing itself,
        the network links) a later ``restore_detached`` of the same id no longer pays: it picks
        the created container up (measured 96 vs 181 ms for a fresh restore, RUNTIME-NOTES).
        Prerequisites and failure: as ``run_detached``. On success: ``runsc state`` says
        ``created``; ``pid_file`` holds the sandbox process's pid.
        """
        runsc = [
            str(self.config.binary),
            *self.config.global_flags(),
            f"--debug-log={log_dir}/",
            "create",
            f"-bundle={bundle}",
            f"-pid-file={pid_file}",
            container_id,
        ]
        await proc.run(_in_net_workaround(console, runsc), timeout=RUN_TIMEOUT_S)

    async def restore_detached(
        self, container_id: str, bundle: Path, image: Path, *, log_dir: Path, console: Path,
        pid_file: Path,
    ) -> None:
        """``runsc restore -detach``: a new sandbox from the memory image in ``image``.

        Prerequisites: as ``run_detached``; ``bundle/config.json`` has the same mounts and
        container name as the checkpointed sandbox's (paths may differ) and a fresh netns
        with the same guest address. On success/failure: as ``run_detached``. A container
        ``create`` made is restored in place (its sandbox process, gofer and links reused).
        """
        runsc = [
            str(self.config.binary),
            *self.config.global_flags(),
            f"--debug-log={log_dir}/",
            "restore",
            "-detach",
            f"-image-path={image}",
            f"-bundle={bundle}",
            f"-pid-file={pid_file}",
            container_id,
        ]
        await proc.run(_in_net_workaround(console, runsc), timeout=RUN_TIMEOUT_S)

    async def checkpoint(
        self, container_id: str, image: Path, *, leave_running: bool, console: Path
    ) -> None:
        """``runsc checkpoint --compression=none``: save the sandbox into ``image`` (a new,
        empty directory). Without ``leave_running`` the sandbox exits once saved.

        On failure: raises ``CommandError``; ``image`` may hold partial files (remove it).
        A refused save (e.g. unsupported state) leaves the sandbox running.
        """
        runsc = [
            str(self.config.binary),
            *self.config.global_flags(),
            "checkpoint",
            # flate costs ~180 ms per 64 MiB of incompressible memory; disk is cheaper.
            "--compression=none",
            f"--image-path={image}",
            *(["--leave-running"] if leave_running else []),
            container_id,
        ]
        await proc.run(_in_net_workaround(console, runsc), timeout=RUN_TIMEOUT_S)

    async def pause(self, container_id: str) -> None:
        """``runsc pause``: stop every task of the sandbox; memory stays."""
        await proc.run(self._argv("pause", container_id), timeout=QUERY_TIMEOUT_S)

    async def resume(self, container_id: str) -> None:
        """``runsc resume`` of a paused sandbox."""
        await proc.run(self._argv("resume", container_id), timeout=QUERY_TIMEOUT_S)

    async def state(self, container_id: str) -> ContainerState:
        """``runsc state``; raises ``CommandError`` (→ ``NotFound``) for unknown ids."""
        done = await proc.run(self._argv("state", container_id), timeout=QUERY_TIMEOUT_S)
        return ContainerState.parse(json.loads(done.stdout))

    async def list(self) -> list[ContainerState]:
        """Every container under our root (``runsc list -format=json``)."""
        done = await proc.run(self._argv("list", "-format=json"), timeout=QUERY_TIMEOUT_S)
        data = json.loads(done.stdout or b"null") or []
        return [ContainerState.parse(item) for item in data]

    async def kill(self, container_id: str, signal: str = "KILL", *, all_: bool = True) -> None:
        """Send ``signal`` to the container's processes (``--all``) or its init."""
        args = ["kill", *(["--all"] if all_ else []), container_id, signal]
        await proc.run(self._argv(*args), timeout=QUERY_TIMEOUT_S)

    async def delete(self, container_id: str) -> None:
        """``runsc delete --force``: kill the sandbox, wait for it, remove its cgroups and
        state. Succeeds for unknown ids (idempotent)."""
        await proc.run(self._argv("delete", "--force", container_id), timeout=DELETE_TIMEOUT_S)

    async def events_stats(self, container_id: str) -> dict[str, Any]:
        """One ``runsc events --stats`` sample: the ``data`` object (cpu, memory, pids,
        network_interfaces) as measured by the sentry."""
        argv = self._argv("events", "--stats", container_id)
        done = await proc.run(argv, timeout=QUERY_TIMEOUT_S)
        event = json.loads(done.stdout.splitlines()[0] if done.stdout else b"{}")
        data = event.get("data") if isinstance(event, dict) else None
        return data if isinstance(data, dict) else {}

    async def exec(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = EXEC_TIMEOUT_S,
        check: bool = True,
    ) -> proc.Completed:
        """Run ``argv`` inside the sandbox and wait for it (tests and diagnostics: the product
        runs commands through envd).

        ``user``: ``uid[:gid]``. Returns the completed process (``check``: raise on non-zero).
        """
        args = ["exec"]
        if user is not None:
            args.append(f"--user={user}")
        if cwd is not None:
            args.append(f"--cwd={cwd}")
        for key, value in (env or {}).items():
            args.append(f"--env={key}={value}")
        return await proc.run(
            self._argv(*args, container_id, *argv), timeout=timeout, check=check
        )
