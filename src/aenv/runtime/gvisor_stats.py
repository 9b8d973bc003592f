"""A running gVisor sandbox's CPU, memory and disk, as ``Runtime.stats`` reports them.

CPU and memory are the sentry's own accounting (``runsc events --stats``): memory is what the
guest uses, page cache included. ``cpu_used_pct`` is the share of the sandbox's CPUs used
since the previous sample (since boot on the first). Disk is the filesystem holding the rootfs
(its upper layer, for an overlay). The sandbox's shape (CPUs, memory limit, rootfs) is read
once from its bundle's ``config.json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aenv.core.errors import NotFound
from aenv.runtime import oci
from aenv.runtime.base import Instance, Stats
from aenv.runtime.runsc import Runsc, map_runsc_errors


class StatsSampler:
    def __init__(self, runsc: Runsc, bundle_dir: Callable[[str], Path]) -> None:
        self._runsc = runsc
        self._bundle_dir = bundle_dir
        #: runtime id → (monotonic seconds, cpu ns) of the previous sample.
        self._cpu_samples: dict[str, tuple[float, int]] = {}
        #: runtime id → (cpu_count, memory bytes, rootfs), read once from config.json.
        self._shapes: dict[str, tuple[int, int, Path]] = {}

    async def sample(self, instance: Instance) -> Stats:
        """On failure: ``NotFound`` (gone), ``RuntimeFailure``."""
        cid = instance.runtime_id
        with map_runsc_errors(instance.sandbox_id, "events"):
            data = await self._runsc.events_stats(cid)
        now = time.monotonic()
        cpu_ns = _int_at(data, "cpu", "usage", "total")
        mem_used = _int_at(data, "memory", "usage", "usage")
        cpu_count, mem_total, rootfs = self._shape(instance)
        previous = self._cpu_samples.get(cid)
        if previous is None:
            previous = (now - _age_s(instance.pid), 0)
        self._cpu_samples[cid] = (now, cpu_ns)
        wall = now - previous[0]
        pct = 100.0 * (cpu_ns - previous[1]) / 1e9 / wall / cpu_count if wall > 0.01 else 0.0
        try:
            fs = os.statvfs(rootfs)
            disk_total = fs.f_blocks * fs.f_frsize
            disk_used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        except OSError:
            disk_total = disk_used = 0
        return Stats(
            cpu_count=cpu_count,
            cpu_used_pct=round(min(max(pct, 0.0), 100.0), 2),
            mem_used=mem_used,
            mem_total=mem_total,
            mem_cache=0,  # the guest's page cache is inside the sentry's memory, not visible
            disk_used=disk_used,
            disk_total=disk_total,
        )

    def forget(self, runtime_id: str) -> None:
        """Drop what is kept of a removed sandbox."""
        self._cpu_samples.pop(runtime_id, None)
        self._shapes.pop(runtime_id, None)

    def _shape(self, instance: Instance) -> tuple[int, int, Path]:
        cid = instance.runtime_id
        shape = self._shapes.get(cid)
        if shape is None:
            try:
                config = oci.read_config(self._bundle_dir(instance.sandbox_id))
            except (OSError, ValueError) as exc:
                raise NotFound(f"sandbox {instance.sandbox_id} has no bundle here") from exc
            resources = config["linux"]["resources"]
            cpus = max(1, int(resources["cpu"]["quota"]) // int(resources["cpu"]["period"]))
            shape = (cpus, int(resources["memory"]["limit"]), Path(config["root"]["path"]))
            self._shapes[cid] = shape
        return shape


def _int_at(data: dict[str, Any], *keys: str) -> int:
    node: Any = data
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return int(node) if isinstance(node, int | float) else 0


def _age_s(pid: int | None) -> float:
    """Seconds since process ``pid`` started (0 if unknown): the first CPU sample's baseline."""
    if pid is None:
        return 0.0
    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
