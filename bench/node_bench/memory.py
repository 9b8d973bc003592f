"""Part 5, memory: what an idle sandbox costs the host (PSS of every process of it)."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.node_bench.common import CGROUP_ROOT, MIB, NODE_CGROUP, Report, SandboxMemory
from bench.node_bench.node import Node


def kib_fields(path: Path, names: tuple[str, ...]) -> dict[str, int]:
    """The ``names`` fields of a ``/proc`` key/kB file (0 when absent), in KiB."""
    values = dict.fromkeys(names, 0)
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in values:
            values[key] = int(rest.split()[0])
    return values


def sandbox_pids(sandbox_id: str, cgroup_parent: str = NODE_CGROUP) -> set[int]:
    """Host processes of one sandbox: its cgroup in every v1 controller, plus any process
    whose command line names it (the runsc CLI, the gofer, the sandbox process; the systrap
    stubs are in the cgroup)."""
    pids: set[int] = set()
    for controller in CGROUP_ROOT.iterdir():
        procs = controller / cgroup_parent / sandbox_id / "cgroup.procs"
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in procs.read_text().split())
    needle = sandbox_id.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
    return pids


def process_kind(pid: int) -> str:
    """runsc-sandbox (the sentry), runsc-gofer, systrap stubs (no command line) or argv[0]."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return "gone"
    if argv0 in ("runsc-sandbox", "runsc-gofer"):
        return argv0
    return "systrap stubs" if not argv0 else Path(argv0).name


def sandbox_memory(sandbox_id: str) -> SandboxMemory:
    """Host-side memory of one sandbox: PSS of its processes and its memory cgroup."""
    total = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0, "Pss_Shmem": 0}
    by_kind: dict[str, float] = {}
    pids = sandbox_pids(sandbox_id)
    for pid in sorted(pids):
        try:
            rollup = kib_fields(Path(f"/proc/{pid}/smaps_rollup"), tuple(total))
        except OSError:
            continue
        for key in total:
            total[key] += rollup[key]
        kind = process_kind(pid)
        by_kind[kind] = round(by_kind.get(kind, 0) + rollup["Pss"] / 1024, 2)
    memcg = CGROUP_ROOT / "memory" / NODE_CGROUP / sandbox_id
    usage: float | None = None
    stat: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        usage = round(int((memcg / "memory.usage_in_bytes").read_text()) / MIB, 2)
        for line in (memcg / "memory.stat").read_text().splitlines():
            key, value = line.split()
            if key in ("rss", "cache", "shmem", "mapped_file", "kernel_stack"):
                stat[key] = round(int(value) / MIB, 2)
    return SandboxMemory(
        sandbox_id,
        len(pids),
        round(total["Pss"] / 1024, 2),
        round(total["Pss_Anon"] / 1024, 2),
        round(total["Pss_File"] / 1024, 2),
        round(total["Pss_Shmem"] / 1024, 2),
        by_kind,
        usage,
        stat,
        None,
    )


def measure_memory(report: Report, node: Node, count: int, idle_s: float) -> None:
    """Memory of ``count`` idle sandboxes, each after one command and ``idle_s`` of rest."""
    sandboxes: list[Any] = []
    try:
        for _ in range(count):
            sandbox = node.create()
            sandbox.commands.run("true")  # envd initialised and served a command
            sandboxes.append(sandbox)
        time.sleep(idle_s)
        # envd's own view first (that command is one more spawn), then settle again.
        guest_rss = {}
        for sandbox in sandboxes:
            with contextlib.suppress(Exception):
                out = sandbox.commands.run("grep VmRSS /proc/1/status", user="root").stdout
                guest_rss[sandbox.sandbox_id] = round(int(out.split()[1]) / 1024, 2)
        time.sleep(idle_s)
        for sandbox in sandboxes:
            mem = sandbox_memory(sandbox.sandbox_id)
            mem.envd_guest_rss_mib = guest_rss.get(sandbox.sandbox_id)
            report.memory.append(mem)
        server = kib_fields(Path(f"/proc/{node.server.process.pid}/smaps_rollup"), ("Pss",))["Pss"]
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    pss = [m.pss_mib for m in report.memory]
    report.memory_summary = {
        "sandboxes": len(pss),
        "idle_s": idle_s,
        "pss_mean_mib": round(statistics.fmean(pss), 2),
        "pss_min_mib": min(pss),
        "pss_max_mib": max(pss),
        "pss_total_mib": round(sum(pss), 2),
        # File pages (mostly the runsc binary) are shared with every runsc process on the
        # machine, so their PSS share shrinks as more sandboxes run: anon + shmem is what
        # each additional sandbox costs.
        "pss_anon_shmem_mean_mib": round(
            statistics.fmean([m.pss_anon_mib + m.pss_shmem_mib for m in report.memory]), 2
        ),
        "server_pss_mib": round(server / 1024, 2),
        "cgroup_usage_mean_mib": round(
            statistics.fmean([m.cgroup_usage_mib or 0.0 for m in report.memory]), 2
        ),
    }
