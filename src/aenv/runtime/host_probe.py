"""Can this host run a runtime, on which platform, and if not, why not: probes that try.

A file that opens (``/dev/kvm``) says little: on a nested, paravirtual KVM gVisor's KVM platform
spins forever and QEMU dies with an emulation failure. So each gVisor platform is asked to run
a trivial workload for real, ``runsc --platform=<p> --network=none --ignore-cgroups do true``
(the host's root, read-only under a tmpfs overlay: no image, bundle or network needed), under a
hard timeout; a platform that has not run it by then spins, and its processes are killed. The
``fake`` runtime runs nothing and is always there.

Each probe returns :class:`HostCheck` lines (``ok``/``warn``/``fail``, a name, the reason) for
``aenv doctor`` and for whoever picks a runtime by name (``runtime/registry.py``).

Owns, while a probe runs: a directory of its own (``aenv-probe-<random>`` in the system's
temporary directory, or under ``scratch``) holding runsc's ``--root`` and ``do``'s bundle (its
``TMPDIR``; ``do`` keeps the container's state there too), and the processes whose command line
names it. Everything is removed before the probe returns, whatever happened (timeout, failure,
cancellation): any process still naming the directory is SIGKILLed, then the directory goes.
Must not touch: any other runsc state (the node's ``--root`` included), cgroups, network
namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aenv.core import proc
from aenv.core.errors import AenvError, CommandTimeout
from aenv.runtime.runsc import RUNSC

Status = Literal["ok", "warn", "fail"]

#: Every platform runsc 20240729 has (``runsc --help``: ``--platform``).
GVISOR_PLATFORMS: tuple[str, ...] = ("ptrace", "systrap", "kvm")
#: ``runsc do true`` took 0.4 s (ptrace) and 1.2 s (systrap) on a 2-core VM under a benchmark's
#: load. A platform that has not run ``true`` by ten times that never will: gVisor's KVM
#: platform on nested PVM spins at 100 % of a core without end.
PLATFORM_TIMEOUT_S = 10.0
#: ``runsc --version`` answers in milliseconds.
QUERY_TIMEOUT_S = 10.0
#: How long killed leftovers get to die before the probe gives up on them (a zombie counts as
#: gone: a doctor has no subreaper, and this VM's PID 1 reaps orphans about once a second).
KILL_WAIT_S = 5.0
_KILL_POLL_S = 0.05
#: ``do`` passes its own environment into the sandbox: a fixed one, so the probe does not
#: depend on the caller's (and no secret of it enters a sandbox).
_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass(frozen=True)
class HostCheck:
    """One thing a probe found out."""

    status: Status
    #: What was checked, as ``aenv doctor`` prints it: ``runtime gvisor (systrap)``.
    name: str
    #: Why: what ran and how long it took, or what failed and its last words.
    reason: str
    #: The platform a workload ran (or failed to run) on; None for a check of the runtime as
    #: a whole (its binary, or a runtime without platforms).
    platform: str | None = None


def working_platforms(checks: Sequence[HostCheck]) -> list[str]:
    """The platforms that ran a workload, in probe order."""
    return [c.platform for c in checks if c.platform is not None and c.status == "ok"]


async def probe_fake() -> list[HostCheck]:
    """The in-memory runtime needs nothing of the host."""
    return [HostCheck("ok", "runtime fake", "always available: in memory, no processes (tests "
                      "of the control plane)")]


async def probe_gvisor(
    platforms: Sequence[str] = GVISOR_PLATFORMS,
    *,
    binary: Path | None = None,
    timeout_s: float = PLATFORM_TIMEOUT_S,
    scratch: Path | None = None,
) -> list[HostCheck]:
    """The runsc binary, then one check per platform, each from a real ``runsc do true``.

    Prerequisites: none (without root, or without runsc, the checks say so).
    On success: ``runtime gvisor`` (runsc's version, or ``fail`` when there is none: then no
    platform is tried), then ``runtime gvisor (<platform>)`` for each of ``platforms`` in
    order. The platforms are tried at once, so the whole takes about the slowest one (at most
    ``timeout_s`` plus the clean-up). Nothing is left behind (see the module docstring).
    On failure: never raises for what it finds; cancellation is passed on after clean-up.
    """
    found = binary or _find_runsc()
    if found is None:
        return [HostCheck("fail", "runtime gvisor",
                          f"runsc not found at {RUNSC} or on PATH (install gVisor)")]
    try:
        done = await proc.run([str(found), "--version"], timeout=QUERY_TIMEOUT_S, check=False)
    except AenvError as exc:
        return [HostCheck("fail", "runtime gvisor", f"{found} does not run: {exc.message}")]
    if done.returncode != 0:
        return [HostCheck("fail", "runtime gvisor",
                          f"{found} --version failed: {_last_line(done.stderr, done.returncode)}")]
    version = done.text.strip().splitlines()[0] if done.text.strip() else "runsc"
    checks = [HostCheck("ok", "runtime gvisor", f"{version} ({found})")]
    checks += await asyncio.gather(*(
        probe_gvisor_platform(p, binary=found, timeout_s=timeout_s, scratch=scratch)
        for p in platforms))
    return checks


async def probe_gvisor_platform(
    platform: str,
    *,
    binary: Path = RUNSC,
    timeout_s: float = PLATFORM_TIMEOUT_S,
    scratch: Path | None = None,
) -> HostCheck:
    """Run ``true`` in a throwaway gVisor sandbox on ``platform``.

    Prerequisites: root (runsc's default, non-rootless mode).
    On success: ``ok`` with the wall time of the run; ``fail`` with runsc's exit status and the
    last line it wrote to stderr, or, when it did not finish within ``timeout_s``, saying that
    the platform spins. Either way its processes, state and directory are gone.
    On failure: never raises for what it finds; cancellation is passed on after clean-up.
    """
    name = f"runtime gvisor ({platform})"
    workdir = Path(tempfile.mkdtemp(prefix="aenv-probe-", dir=scratch))
    # Short: runsc's control socket ends up under workdir (``do`` keeps its state in its
    # bundle, in TMPDIR), and a Unix socket path has 107 bytes.
    state = workdir / "s"
    # --ignore-cgroups: ``do`` would make a ``runsc-<id>`` cgroup in every hierarchy, and a
    # killed run leaves it behind; the doctor checks cgroups on its own.
    argv = [str(binary), f"--root={state}", f"--platform={platform}", "--network=none",
            "--ignore-cgroups", "do", "-cwd=/", "true"]
    started = time.monotonic()
    try:
        try:
            done = await proc.run(argv, timeout=timeout_s, check=False,
                                  env={**_ENV, "TMPDIR": str(workdir)}, cwd=workdir)
        except CommandTimeout:
            return HostCheck("fail", name, f"did not run a process in {timeout_s:g} s: the "
                             f"{platform} platform spins on this host, and was killed", platform)
        except AenvError as exc:
            return HostCheck("fail", name, f"runsc did not start: {exc.message}", platform)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            return HostCheck("fail", name, f"runsc exited with status {done.returncode}: "
                             f"{_last_line(done.stderr, done.returncode)}", platform)
        return HostCheck("ok", name, f"ran a process in {seconds:.1f} s", platform)
    finally:
        await asyncio.shield(_clean_up(workdir))


async def _clean_up(workdir: Path) -> None:
    """Remove what a probe run may have left; never raises (but cancellation).

    A ``do`` stopped by SIGTERM (``proc.run``'s timeout) takes its sandbox down and leaves only
    its bundle; one SIGKILLed, or a sandbox stuck in a spinning platform, may leave processes.
    Every runsc process gets the state directory (inside ``workdir``) on its command line, so
    they are found there, also when runsc never wrote a state file to find them by.
    """
    await _kill_naming(str(workdir).encode())
    shutil.rmtree(workdir, ignore_errors=True)


async def _kill_naming(marker: bytes) -> None:
    pids = _pids_naming(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while pids and time.monotonic() < deadline:
        await asyncio.sleep(_KILL_POLL_S)
        pids = _pids_naming(marker)


def _pids_naming(marker: bytes) -> list[int]:
    """Live (not yet zombie) processes whose command line contains ``marker``."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a zombie's (empty) command line
        if marker in cmdline:
            found.append(int(entry))
    return found


def _find_runsc() -> Path | None:
    if RUNSC.exists():
        return RUNSC
    found = shutil.which("runsc")
    return Path(found) if found else None


def _last_line(stderr: bytes, returncode: int) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    return " ".join(lines[-1].split())[:200] if lines else f"exit status {returncode}"


#: The probe of each runtime ``Settings.runtime`` can name.

