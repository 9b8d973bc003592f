"""The kernel's KSM controls and counters (``/sys/kernel/mm/ksm``) and ksmd's CPU, for
``bench.ksm_bench``: read and set the knobs, wait for full scans, and put everything back."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bench.lifecycle.common import log
from bench.lifecycle.idle_cpu import cpu_ticks

KSM = Path("/sys/kernel/mm/ksm")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
#: Kernel defaults of the scan rate (5,000 pages/s).
DEFAULT_PAGES_TO_SCAN = 100
DEFAULT_SLEEP_MS = 20

COUNTERS = (
    "full_scans",
    "pages_shared",
    "pages_sharing",
    "pages_unshared",
    "pages_volatile",
    "pages_scanned",
    "pages_skipped",
    "ksm_zero_pages",
    "general_profit",
)


def knob(name: str) -> int:
    return int((KSM / name).read_text().split()[0])


def set_knob(name: str, value: int) -> None:
    (KSM / name).write_text(f"{value}\n")


def counters() -> dict[str, float]:
    values: dict[str, float] = {name: knob(name) for name in COUNTERS}
    values["general_profit_mib"] = round(values["general_profit"] / 2**20, 2)
    values["saved_mib"] = round(values["pages_sharing"] * PAGE / 2**20, 2)
    return values


def ksmd_pid() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "ksmd":
                    return int(entry.name)
    return None


class KsmdClock:
    """CPU of ksmd since the last ``reset``, as % of one core."""

    def __init__(self) -> None:
        self.pid = ksmd_pid()
        self.reset()

    def reset(self) -> None:
        self.ticks = cpu_ticks({self.pid} if self.pid else set())
        self.start = time.monotonic()

    def pct(self) -> tuple[float, float]:
        """(% of a core, seconds) since ``reset``."""
        elapsed = time.monotonic() - self.start
        ticks = cpu_ticks({self.pid} if self.pid else set()) - self.ticks
        return round(100.0 * ticks / CLK_TCK / elapsed, 2), round(elapsed, 1)


@contextlib.contextmanager
def ksm_restored() -> Iterator[dict[str, int]]:
    """Yield the original knobs; afterwards unmerge (``run=2``), stop (``run=0``) and put the
    scan rate back, whatever happened."""
    original = {name: knob(name) for name in ("run", "pages_to_scan", "sleep_millisecs")}
    try:
        yield original
    finally:
        for name, value in (
            ("run", 2),
            ("run", 0),
            ("pages_to_scan", original["pages_to_scan"]),
            ("sleep_millisecs", original["sleep_millisecs"]),
        ):
            try:
                set_knob(name, value)
            except OSError as exc:
                log(f"could not set ksm/{name}={value}: {exc}")
        if original["run"] != 0:
            log(f"note: ksm/run was {original['run']} before the run; left at 0")


def wait_full_scans(start: int, scans: int, timeout: float) -> int:
    """Wait until ``full_scans`` is at least ``start + scans``: the scans done."""
    deadline = time.monotonic() + timeout
    while knob("full_scans") < start + scans:
        if time.monotonic() > deadline:
            raise TimeoutError(f"ksm did {knob('full_scans') - start}/{scans} full scans")
        time.sleep(0.5)
    return knob("full_scans") - start
