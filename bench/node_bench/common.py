"""What every part of the node benchmark shares: targets, cgroups, result types, timers."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.envd_bench.common import Latency

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "node.json"
MIB = 1024 * 1024

#: Targets from the issue.
TARGET_CREATE_RATIO = 1.5  # create → first command, over the bare runsc baseline
TARGET_ROUND_TRIP_P50_MS = 10.0
TARGET_IDLE_PSS_MIB = 60.0  # per idle sandbox, envd included
#: The SDK gives up on a request after 60 s; N concurrent cold creates on 2 busy cores can take
#: about that long, and the point is to see when all of them are done.
CONCURRENT_REQUEST_TIMEOUT_S = 600.0

#: Host cgroup parent of the node's sandboxes (``GvisorConfig.cgroup_parent``) and ours.
NODE_CGROUP = "aenv"
BARE_CGROUP = "aenv-bench"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class CreateSample:
    """One timed create → first command, with the server's phase breakdown if it logs one."""

    variant: str
    sandbox_id: str
    create_ms: float
    first_command_ms: float
    total_ms: float
    #: CPU of the sandbox's cgroup (sentry, gofer, envd...) when the first command answered:
    #: everything since the boot, which for a warm sandbox happened before the create.
    sandbox_cpu_ms: float | None = None
    #: CPU of the server process and its reaped children (runsc, mount, ip) during the create.
    server_cpu_ms: float | None = None
    server_phases_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class BareSample:
    """One bare ``runsc run -detach`` + first ``runsc exec true``."""

    run_ms: float
    exec_ms: float
    total_ms: float
    #: CPU of the sandbox's cgroup after the exec answered.
    sandbox_cpu_ms: float | None = None


@dataclass
class SandboxMemory:
    """Memory of one idle sandbox: host processes (PSS, MiB) and cross-checks."""

    sandbox_id: str
    processes: int
    pss_mib: float
    pss_anon_mib: float
    pss_file_mib: float
    pss_shmem_mib: float
    by_kind_mib: dict[str, float]
    cgroup_usage_mib: float | None
    cgroup_stat_mib: dict[str, float]
    envd_guest_rss_mib: float | None


@dataclass
class Report:
    """Everything one run measured; serialised as-is to bench/results/node.json."""

    meta: dict[str, Any]
    create: dict[str, list[Latency]] = field(default_factory=dict)
    create_samples: list[CreateSample] = field(default_factory=list)
    bare: list[Latency] = field(default_factory=list)
    bare_samples: list[BareSample] = field(default_factory=list)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    round_trip: list[Latency] = field(default_factory=list)
    derived: dict[str, float] = field(default_factory=dict)
    concurrent: dict[str, Any] = field(default_factory=dict)
    memory: list[SandboxMemory] = field(default_factory=list)
    memory_summary: dict[str, float] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def ms_since(start: float) -> float:
    """Milliseconds since ``start`` (a ``time.perf_counter()`` value)."""
    return (time.perf_counter() - start) * 1000


def p50(samples: list[float]) -> float:
    """Median, rounded to µs."""
    return round(statistics.median(samples), 3)


def cgroup_cpu_ms(relative: str) -> float | None:
    """CPU time of a host cgroup (cpuacct, v1), ms."""
    try:
        return round(
            int((CGROUP_ROOT / "cpuacct" / relative / "cpuacct.usage").read_text()) / 1e6, 1
        )
    except (OSError, ValueError):
        return None


def process_cpu_ms(pid: int) -> float:
    """utime + stime of ``pid`` and of its reaped children, ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def remove_cgroups(relative: str) -> None:
    """Remove a host cgroup in every v1 controller (what runsc leaves behind)."""
    for controller in CGROUP_ROOT.iterdir():
        path = controller / relative
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()
