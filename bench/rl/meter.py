"""What a mode costs: a ledger of every sandbox's running and paused time, a sampler of the
memory of their host processes and of the node's disk.

Owns nothing on the node: it only reads ``/proc``, the node's cgroups and its home.

* **Environment-seconds** (``Ledger``): a sandbox runs from the answer to its create or fork
  (or resume) until the answer to its pause or kill; it is paused from the pause's answer to
  its kill. ``MeteredClient`` records those answers; it is the ``aenv.client.AsyncClient``
  every mode uses, so the RL pool is metered through the same calls as the hand-written loops.
* **Memory GB-hours** (``Sampler``): every ``MEM_PERIOD_S`` the PSS of every host process of
  every sandbox in the ledger that is not killed yet (its cgroup in each v1 controller, plus
  any process whose command line names it: ``bench.node_bench.memory.sandbox_pids``, done for
  all sandboxes in one ``/proc`` pass), summed; the run's GB-hours are the integral of that
  sum over time (GiB, 2^30 bytes). Split by the sandbox's state (running or paused).
* **Disk** (``Sampler``): every ``DISK_PERIOD_S`` the bytes allocated under the node's home:
  files on the home's own file system (snapshots, images), without descending into other
  mounts, plus the used bytes of each file system mounted directly under the home (the xfs of
  the workspaces). Reported as the peak above the value at the mode's start.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv.client import AsyncClient, Forked, Sandbox
from bench.node_bench.common import CGROUP_ROOT, NODE_CGROUP

#: Memory sampling period (s): short against a rollout of a few seconds.
MEM_PERIOD_S = 0.5
#: Disk sampling period (s): a walk of the home costs more than a memory sample.
DISK_PERIOD_S = 3.0
GIB = 2**30


@dataclass
class Life:
    """One sandbox's life as the ledger saw it (monotonic seconds)."""

    sandbox_id: str
    role: str
    running_since: float | None
    paused_since: float | None = None
    running_s: float = 0.0
    paused_s: float = 0.0
    ended: float | None = None

    def close(self, now: float) -> None:
        if self.running_since is not None:
            self.running_s += now - self.running_since
        if self.paused_since is not None:
            self.paused_s += now - self.paused_since
        self.running_since = self.paused_since = None


@dataclass
class Ledger:
    """Every sandbox a mode made, by id; thread-safe (the sampler reads it)."""

    lives: dict[str, Life] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self, sandbox_id: str, role: str) -> None:
        with self.lock:
            self.lives[sandbox_id] = Life(sandbox_id, role, time.monotonic())

    def paused(self, sandbox_id: str) -> None:
        now = time.monotonic()
        with self.lock:
            life = self.lives.get(sandbox_id)
            if life is not None and life.running_since is not None:
                life.running_s += now - life.running_since
                life.running_since, life.paused_since = None, now

    def resumed(self, sandbox_id: str) -> None:
        now = time.monotonic()
        with self.lock:
            life = self.lives.get(sandbox_id)
            if life is not None and life.paused_since is not None:
                life.paused_s += now - life.paused_since
                life.running_since, life.paused_since = now, None

    def killed(self, sandbox_id: str) -> None:
        now = time.monotonic()
        with self.lock:
            life = self.lives.get(sandbox_id)
            if life is not None and life.ended is None:
                life.close(now)
                life.ended = now

    def alive(self) -> dict[str, str]:
        """Sandboxes not killed yet: id → ``running`` or ``paused``."""
        with self.lock:
            return {
                sid: "paused" if life.paused_since is not None else "running"
                for sid, life in self.lives.items()
                if life.ended is None
            }

    def totals(self) -> dict[str, Any]:
        now = time.monotonic()
        with self.lock:
            for life in self.lives.values():
                if life.ended is None:  # not killed: count it up to now, and say so
                    life.close(now)
                    life.ended = now
            lives = list(self.lives.values())
        by_role: dict[str, dict[str, float]] = {}
        for life in lives:
            row = by_role.setdefault(life.role, {"sandboxes": 0, "running_s": 0.0, "paused_s": 0.0})
            row["sandboxes"] += 1
            row["running_s"] += life.running_s
            row["paused_s"] += life.paused_s
        return {
            "sandboxes": len(lives),
            "env_s": round(sum(life.running_s for life in lives), 2),
            "paused_s": round(sum(life.paused_s for life in lives), 2),
            "by_role": {
                role: {k: round(v, 2) for k, v in row.items()} for role, row in by_role.items()
            },
        }


class MeteredClient(AsyncClient):
    """An ``AsyncClient`` that tells the ledger when each of its sandboxes runs, pauses or is
    killed (at the node's answer). ``role``: the label the next sandboxes get (set per phase
    by the mode: ``build``, ``episode``, ``parent``, ``rollout``); per asyncio task, so that
    two tasks in different phases at once each label their own sandboxes (a task started
    afterwards inherits the role of its starter)."""

    def __init__(self, ledger: Ledger, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ledger = ledger
        self._role: contextvars.ContextVar[str] = contextvars.ContextVar("role",
                                                                         default="episode")

    @property
    def role(self) -> str:
        return self._role.get()

    @role.setter
    def role(self, value: str) -> None:
        self._role.set(value)

    async def create(self, template: str = "base", **kwargs: Any) -> Sandbox:
        sandbox = await super().create(template, **kwargs)
        self.ledger.started(sandbox.sandbox_id, self.role)
        return sandbox

    async def fork(self, sandbox_id: str, count: int, *, timeout: int | None = None) -> Forked:
        forked = await super().fork(sandbox_id, count, timeout=timeout)
        for child in forked:
            self.ledger.started(child.sandbox_id, "rollout")
        return forked

    async def connect(self, sandbox_id: str, *, timeout: int | None = None) -> Sandbox:
        sandbox = await super().connect(sandbox_id, timeout=timeout)
        self.ledger.resumed(sandbox_id)
        return sandbox

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        await super().pause(sandbox_id, memory=memory)
        self.ledger.paused(sandbox_id)

    async def kill(self, sandbox_id: str) -> bool:
        try:
            return await super().kill(sandbox_id)
        finally:
            self.ledger.killed(sandbox_id)


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def sandbox_processes(
    ids: Mapping[str, str], cgroup_parent: str = NODE_CGROUP
) -> dict[str, set[int]]:
    """Host processes of each sandbox in ``ids``, as ``node_bench.memory.sandbox_pids``, in one
    pass."""
    found: dict[str, set[int]] = {sid: set() for sid in ids}
    for controller in ("memory", "pids", "cpu"):
        for sid in ids:
            procs = CGROUP_ROOT / controller / cgroup_parent / sid / "cgroup.procs"
            with contextlib.suppress(OSError, ValueError):
                found[sid].update(int(p) for p in procs.read_text().split())
    needles = {sid: sid.encode() for sid in ids}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        for sid, needle in needles.items():
            if needle in cmdline:
                found[sid].add(int(entry.name))
    return found


def _allocated(path: Path, device: int) -> int:
    """Bytes allocated to files under ``path`` on ``device``, not crossing other mounts."""
    total = 0
    stack = [str(path)]
    while stack:
        top = stack.pop()
        with contextlib.suppress(OSError), os.scandir(top) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if st.st_dev != device:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += st.st_blocks * 512
    return total


def home_bytes(home: Path) -> int:
    """Disk used by the node's home: its own file system's files plus the used bytes of each
    file system mounted right under it (the workspaces' xfs)."""
    device = home.stat().st_dev
    total = _allocated(home, device)
    for child in home.iterdir():
        with contextlib.suppress(OSError):
            if child.is_dir() and child.stat().st_dev != device:
                vfs = os.statvfs(child)
                total += (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    return total


class Sampler(threading.Thread):
    """Samples memory (every ``MEM_PERIOD_S``) and disk (every ``DISK_PERIOD_S``) while a mode
    runs; ``stop()`` ends it and returns the summary."""

    def __init__(self, ledger: Ledger, home: Path | None) -> None:
        super().__init__(name="rl-bench-sampler", daemon=True)
        self.ledger = ledger
        self.home = home
        self._stop_event = threading.Event()
        self.mib_s = {"running": 0.0, "paused": 0.0}
        self.peak_mib = 0.0
        self.samples = 0
        self.disk_start = home_bytes(home) if home is not None else 0
        self.disk_peak = self.disk_start
        self.series: list[tuple[float, float, float]] = []  # (t, running MiB, paused MiB)
        self._t0 = time.monotonic()

    def run(self) -> None:
        last = time.monotonic()
        last_disk = 0.0
        while not self._stop_event.wait(MEM_PERIOD_S):
            alive = self.ledger.alive()
            processes = sandbox_processes(alive)
            mib = {"running": 0.0, "paused": 0.0}
            for sid, pids in processes.items():
                mib[alive[sid]] += sum(_pss_kib(p) for p in pids) / 1024
            now = time.monotonic()
            for state in mib:
                self.mib_s[state] += mib[state] * (now - last)
            last = now
            self.samples += 1
            self.peak_mib = max(self.peak_mib, mib["running"] + mib["paused"])
            self.series.append(
                (round(now - self._t0, 2), round(mib["running"], 1), round(mib["paused"], 1))
            )
            if self.home is not None and now - last_disk >= DISK_PERIOD_S:
                self.disk_peak = max(self.disk_peak, home_bytes(self.home))
                last_disk = time.monotonic()

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join()
        if self.home is not None:
            self.disk_peak = max(self.disk_peak, home_bytes(self.home))
        gbh = {k: v / 1024 / 3600 for k, v in self.mib_s.items()}
        return {
            "gb_h": round(gbh["running"] + gbh["paused"], 5),
            "gb_h_running": round(gbh["running"], 5),
            "gb_h_paused": round(gbh["paused"], 5),
            "peak_mib": round(self.peak_mib, 1),
            "samples": self.samples,
            # None: the node's home is not known here (a node given by E2B_API_URL).
            "disk_start_mib": None if self.home is None else round(self.disk_start / 2**20, 1),
            "disk_peak_added_mib": None
            if self.home is None
            else round((self.disk_peak - self.disk_start) / 2**20, 1),
        }
