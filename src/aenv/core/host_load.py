"""The machine's load, read from ``/proc``: CPU busy between two reads, and memory used.
For the cluster's heartbeat and the node's gauges."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CpuMeter:
    """Machine CPU busy % between two calls, from ``/proc/stat``."""

    _last: tuple[int, int] | None = field(default=None)

    def percent(self) -> float:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0.0
        idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
        last, self._last = self._last, (idle, total)
        if last is None or total <= last[1]:
            return 0.0
        return round(100.0 * (1 - (idle - last[0]) / (total - last[1])), 1)


def memory() -> tuple[int, int]:
    """(used, total) bytes of the machine: total minus available, total."""
    info: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            info[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 1
    total = info.get("MemTotal", 1)
    return total - info.get("MemAvailable", total), total
