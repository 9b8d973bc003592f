"""CPU, memory and disk of the sandbox as envd's ``GET /metrics`` reports them."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies from the first line of /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields[:8])
    return total - idle, total


def _meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                values[key] = int(parts[0]) * 1024
    return values


@dataclass
class CpuSampler:
    """Usage since the previous sample (the first sample covers a short fixed window)."""

    _last: tuple[float, float] | None = None

    def percent(self) -> float:
        now = _cpu_times()
        last = self._last or (0.0, 0.0)  # first call: the average since boot
        self._last = now
        busy, total = now[0] - last[0], now[1] - last[1]
        return round(100.0 * busy / total, 2) if total > 0 else 0.0


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def snapshot(sampler: CpuSampler, disk_path: str = "/") -> dict[str, float | int]:
    mem = _meminfo()
    total = mem.get("MemTotal", 0)
    available = mem.get("MemAvailable", mem.get("MemFree", 0))
    cache = mem.get("Cached", 0) + mem.get("Buffers", 0)
    used = max(total - available, 0)
    st = os.statvfs(disk_path)
    disk_total = st.f_blocks * st.f_frsize
    disk_used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {
        "ts": int(time.time()),
        "cpu_count": cpu_count(),
        "cpu_used_pct": sampler.percent(),
        "mem_total": total,
        "mem_used": used,
        "mem_cache": cache,
        "mem_total_mib": total // (1024 * 1024),
        "mem_used_mib": used // (1024 * 1024),
        "disk_used": disk_used,
        "disk_total": disk_total,
    }
