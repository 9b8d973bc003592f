"""The host cgroups of sandboxes, read and removed by path (relative to the cgroup root).

A sandbox's cgroup is ``<cgroup_parent>/<sandbox_id>`` in every hierarchy (v1 controllers or
v2), made by runsc. Owns: nothing; reads counters, rmdirs empty cgroups, and kills what is
left in a sandbox's cgroup when its runtime is destroyed (``kill_left``: runsc's delete knows
only the processes its state file names, and a restore cut short by a shutdown has none
yet). Must not touch: other cgroups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger("aenv.runtime")

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _everywhere(relative: str) -> list[Path]:
    """``relative`` under the v2 root and under every v1 hierarchy."""
    candidates = [CGROUP_ROOT / relative]
    with contextlib.suppress(OSError):
        candidates += [d / relative for d in CGROUP_ROOT.iterdir() if d.is_dir()]
    return candidates


def _counter(*paths: Path) -> int | None:
    """The first of ``paths`` that holds a number (v1 controller's file, then v2's)."""
    for path in paths:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def memory_charged(relative: str) -> int | None:
    """Bytes memory cgroup ``relative`` is charged now (v1 ``memory.usage_in_bytes``, v2
    ``memory.current``), or None if it has none."""
    return _counter(CGROUP_ROOT / "memory" / relative / "memory.usage_in_bytes",
                    CGROUP_ROOT / relative / "memory.current")


def oom_kills(relative: str) -> tuple[int, int]:
    """OOM kills counted in memory cgroup ``relative`` (v1 ``memory.oom_control``, v2
    ``memory.events``; every mounted hierarchy is looked at), and its limit in bytes (0 if
    unknown)."""
    kills = limit = 0
    for path in _everywhere(relative):
        for name, limit_name in (
            ("memory.oom_control", "memory.limit_in_bytes"),
            ("memory.events", "memory.max"),
        ):
            try:
                pairs = [line.split() for line in (path / name).read_text().splitlines()]
                counters = {p[0]: int(p[1]) for p in pairs if len(p) == 2}
            except (OSError, ValueError):
                continue
            if counters.get("oom_kill", 0) > 0:
                kills += counters["oom_kill"]
                with contextlib.suppress(OSError, ValueError):
                    limit = int((path / limit_name).read_text())
    return kills, limit


def pids_limit_hits(relative: str) -> tuple[int, int]:
    """Forks refused because pids cgroup ``relative`` was at its limit (``pids.events``
    ``max``, v1 and v2; every mounted hierarchy is looked at), and that limit (0 if unknown)."""
    hits = limit = 0
    for path in _everywhere(relative):
        try:
            pairs = [line.split() for line in (path / "pids.events").read_text().splitlines()]
            counters = {p[0]: int(p[1]) for p in pairs if len(p) == 2}
        except (OSError, ValueError):
            continue
        if counters.get("max", 0) > 0:
            hits += counters["max"]
            with contextlib.suppress(OSError, ValueError):
                limit = int((path / "pids.max").read_text())
    return hits, limit


def remove(relative: str) -> None:
    """rmdir the (empty) cgroup ``relative`` in every hierarchy: v1 controllers and v2."""
    for path in _everywhere(relative):
        if path.is_dir():
            try:
                path.rmdir()
            except OSError as exc:  # still has processes: nothing we may kill here
                log.warning("cannot remove cgroup %s: %s", path, exc)


def processes(relative: str) -> set[int]:
    """Pids in cgroup ``relative``, in any hierarchy."""
    found: set[int] = set()
    for path in _everywhere(relative):
        with contextlib.suppress(OSError, ValueError):
            found.update(int(x) for x in (path / "cgroup.procs").read_text().split())
    return found


def kill_left(relative: str) -> set[int]:
    """SIGKILL every process still in cgroup ``relative``, thawing it first (a frozen process
    does not die until thawed); the pids signalled."""
    left = processes(relative)
    if not left:
        return left
    for path in _everywhere(relative):
        for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
            with contextlib.suppress(OSError):
                (path / name).write_text(value)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def tasks(relative: str) -> int | None:
    """Tasks (threads) in pids cgroup ``relative`` now (``pids.current``, v1 or v2), or None
    if it has none."""
    return _counter(CGROUP_ROOT / "pids" / relative / "pids.current",
                    CGROUP_ROOT / relative / "pids.current")
