"""``aenv doctor``: can a node run on this host, and if not, why not.

Each check prints one line, ``ok``, ``warn`` or ``fail``, with its reason; the command exits 1
when a check the configured node needs failed (it cannot run here), 0 otherwise. The checks
only look or make throwaway things of their own, removed at once: a network namespace named
``aenvdoctor-<pid>`` (outside the node's ``aenv-<n>`` names, so a node's sweep never takes it
for one of its slots) with an nft table and a veth pair inside it, and one throwaway gVisor
sandbox per platform (:mod:`aenv.runtime.host_probe`: its own runsc ``--root`` in a temporary
directory, no network). Nothing on the host's own network, cgroups or disks is changed. The
node's configuration (``AENV_*``, ``AENV_CONFIG``) is read as ``aenv server`` reads it, so the
runtime, disk and workspace checks look at what the node would use.

The checks are the node's prerequisites (docs/node.md): root; each runtime this build has and,
for gVisor, each platform (ptrace, systrap, kvm), judged by running ``true`` in a sandbox on it
within ``host_probe.PLATFORM_TIMEOUT_S`` (a platform that spins, as gVisor's KVM platform does on
a nested, paravirtual ``/dev/kvm``, is killed and reported); the cgroup controllers runsc
limits sandboxes with (memory, cpu, pids); network namespaces, veth pairs and nftables; free
space in ``AENV_HOME``; for disk workspaces, loop devices and ``mkfs.xfs`` / ``mkfs.ext4``.
Of the runtime lines only the configured runtime (``AENV_RUNTIME``) and, for gVisor, the
configured platform (``AENV_RUNSC_PLATFORM``) decide the exit status; the others are reported
(a ``fail`` there says what this host cannot do) with what the node uses instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
import typer
from rich.text import Text

from aenv.cli.common import examples, out
from aenv.core import proc
from aenv.core.errors import AenvError
from aenv.runtime.host_probe import HostCheck, working_platforms
from aenv.runtime.registry import DRIVERS

#: Every registered runtime's host probe, by name (``runtime/registry.py``).
PROBES = {name: driver.probe for name, driver in DRIVERS.items()}

Status = Literal["ok", "warn", "fail"]

#: One probe command: they answer in milliseconds; a hung one must not hang the doctor. (The
#: runtime probes keep their own timeouts: runtime/host_probe.py.)
PROBE_TIMEOUT_S = 15.0
#: Free space in AENV_HOME below which the node will not get far (a template's layers and a
#: few sandboxes' writable layers) / below which it is worth a warning.
DISK_FAIL_BYTES = 2 << 30
DISK_WARN_BYTES = 20 << 30
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: What runsc's ``linux.resources`` for a sandbox need (runtime/oci.py).
CONTROLLERS = ("memory", "cpu", "pids")


@dataclass(frozen=True)
class Check:
    status: Status
    name: str
    reason: str
    #: Whether the configured node needs this: a ``fail`` of a check it does not need (a
    #: runtime or platform it does not use) is reported but leaves the exit status 0.
    needed: bool = True


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("aenv doctor", "AENV_HOME=/srv/aenv aenv doctor"))(doctor)


def doctor() -> None:
    """Check this host for what a node needs; exit 1 if it cannot run here."""
    from aenv.core.settings import Settings

    try:
        settings = Settings()
    except Exception as exc:  # pydantic's errors are many lines: the first says which field
        checks = [Check("fail", "config", " ".join(str(exc).split())[:300])]
        fields = Settings.model_fields
        home, workspace = Path("/var/lib/aenv"), "disk"
        runtime, platform = str(fields["runtime"].default), str(fields["runsc_platform"].default)
    else:
        checks = []
        home, workspace = settings.home, settings.workspace
        runtime, platform = settings.runtime, settings.runsc_platform

    async def flow() -> list[Check]:
        found = [await _root()]
        found += await _runtimes(runtime, platform)
        probes: list[Callable[[], Awaitable[Check]]] = [_cgroups, _network]
        for probe in probes:
            found.append(await probe())
        found.append(_disk(home))
        found += await _workspaces(workspace)
        return found

    checks += anyio.run(flow)
    style = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in checks:
        line = Text(f"{check.status:<4} ", style=style[check.status])
        line.append(f"{check.name}: {check.reason}")
        out.print(line, soft_wrap=True)
    failed = [c.name for c in checks if c.status == "fail" and c.needed]
    if failed:
        out.print(f"the node cannot run here: {', '.join(failed)}", soft_wrap=True)
        raise typer.Exit(1)
    out.print("the node can run here", soft_wrap=True)


async def _probe(*argv: str) -> tuple[bool, str]:
    """Run ``argv``; (succeeded, its stdout or the reason it did not)."""
    try:
        done = await proc.run(argv, timeout=PROBE_TIMEOUT_S, check=False)
    except AenvError as exc:
        return False, exc.message
    if done.returncode != 0:
        text = done.stderr.decode("utf-8", "replace").strip() or f"exit {done.returncode}"
        return False, " ".join(text.split())[:200]
    return True, done.text.strip()


async def _root() -> Check:
    if os.geteuid() == 0:
        return Check("ok", "root", "running as root")
    return Check("fail", "root", "the node needs root (network namespaces, nft, runsc)")


async def _runtimes(runtime: str, platform: str) -> list[Check]:
    """Every runtime's probe, all at once (gVisor's takes up to its platform timeout); only
    what the configured ``runtime`` (and gVisor ``platform``) needs decides the exit status."""
    names = list(PROBES)
    results = await asyncio.gather(*(PROBES[name]() for name in names))
    uses = f"{runtime} on {platform}" if runtime == "gvisor" else runtime
    checks: list[Check] = []
    for name, found in zip(names, results, strict=True):
        for check in found:
            needed = name == runtime and check.platform in (None, platform)
            reason = check.reason
            if check.status == "fail" and not needed:
                reason += f" (not used: the node runs {uses})"
            elif check.status == "fail" and check.platform == platform:
                reason += _instead(found)
            checks.append(Check(check.status, check.name, reason, needed))
    return checks


def _instead(found: list[HostCheck]) -> str:
    others = working_platforms(found)
    if not others:
        return ""
    return f"; {others[0]} works here: set AENV_RUNSC_PLATFORM={others[0]}"


async def _cgroups() -> Check:
    v2 = CGROUP_ROOT / "cgroup.controllers"
    if v2.exists():
        have = set(v2.read_text().split())
        kind = "v2"
    else:
        have = {d.name for d in CGROUP_ROOT.iterdir() if (d / "tasks").exists()} \
            if CGROUP_ROOT.is_dir() else set()
        # v1 mounts cpu and cpuacct together as "cpu,cpuacct" on many distributions.
        have |= {part for name in have for part in name.split(",")}
        kind = "v1"
    if not have:
        return Check("fail", "cgroups", f"no cgroup hierarchy under {CGROUP_ROOT}")
    missing = [c for c in CONTROLLERS if c not in have]
    if missing:
        return Check("fail", "cgroups", f"{kind}: controller(s) {', '.join(missing)} missing "
                     f"(sandbox limits need {', '.join(CONTROLLERS)})")
    return Check("ok", "cgroups", f"{kind} with {', '.join(CONTROLLERS)}")


async def _network() -> Check:
    """A namespace of our own with an nft table and a veth pair in it, then removed."""
    ip = shutil.which("ip")
    nft = shutil.which("nft")
    if ip is None:
        return Check("fail", "network", "ip (iproute2) not found")
    if nft is None:
        return Check("fail", "network", "nft (nftables) not found")
    name = f"aenvdoctor-{os.getpid()}"
    ok, text = await _probe(ip, "netns", "add", name)
    if not ok:
        return Check("fail", "network", f"cannot create a network namespace: {text}")
    try:
        ok, text = await _probe(ip, "netns", "exec", name, nft, "add", "table", "inet", "aenv")
        if not ok:
            return Check("fail", "network", f"nftables does not work: {text}")
        ok, text = await _probe(ip, "-n", name, "link", "add", "d0", "type", "veth",
                                "peer", "name", "d1")
        if not ok:
            return Check("fail", "network", f"cannot create a veth pair: {text}")
    finally:
        await _probe(ip, "netns", "delete", name)
    return Check("ok", "network", "network namespace, veth pair and nftables work")


def _disk(home: Path) -> Check:
    where = home
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    text = f"{free / (1 << 30):.1f} GiB free in {home}" + ("" if where == home
                                                           else f" (on {where})")
    if free < DISK_FAIL_BYTES:
        return Check("fail", "disk", text + f"; need at least {DISK_FAIL_BYTES >> 30} GiB")
    if free < DISK_WARN_BYTES:
        return Check("warn", "disk", text + " (little room for templates and workspaces)")
    return Check("ok", "disk", text)


async def _workspaces(workspace: str) -> list[Check]:
    """Disk workspaces need loop devices and mkfs; memory workspaces need neither."""
    bad: Status = "fail" if workspace == "disk" else "warn"
    why = f"(workspace={workspace}: " + ("needed)" if workspace == "disk" else "not needed)")
    checks: list[Check] = []
    losetup = shutil.which("losetup")
    if losetup is None:
        checks.append(Check(bad, "loop devices", f"losetup not found {why}"))
    else:
        ok, text = await _probe(losetup, "--find")
        checks.append(Check("ok", "loop devices", f"next free {text}") if ok else
                      Check(bad, "loop devices", f"none free: {text} {why}"))
    tools = [t for t in ("mkfs.xfs", "mkfs.ext4") if shutil.which(t) is None]
    checks.append(Check(bad, "mkfs", f"{', '.join(tools)} not found {why}") if tools else
                  Check("ok", "mkfs", "mkfs.xfs and mkfs.ext4 found"))
    return checks
