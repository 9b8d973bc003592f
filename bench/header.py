"""The head of every benchmark report: when, on what machine, with which runsc, Python and SDK,
and under what load.

Numbers only compare within one machine (docs/benchmarks.md), so each report's JSON ``meta``
and the first line of its markdown say where and when they were taken. This module owns those
facts and how they are written; it measures nothing and knows no benchmark's own fields.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from aenv.runtime.runsc import RUNSC

MIB = 1024 * 1024


def utc_now() -> str:
    """The run's date, to the minute."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> dict[str, Any]:
    """What the numbers were measured on (they only compare within one machine)."""
    os_name = "Linux"
    with open("/etc/os-release") as f:
        for line in f:
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
        platform.machine(),
    )
    # Process creation and page faults cost much more under a hypervisor: worth stating.
    virtual = any(line.startswith("flags") and " hypervisor" in line for line in cpuinfo)
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    cpus = os.cpu_count() or 0
    return {
        "description": (
            f"{cpus} vCPU {cpu}{' (VM)' if virtual else ''}, {os_name}, "
            f"kernel {platform.release()}, {round(mem_kib / MIB)} GiB RAM"
        ),
        "cpus": cpus,
        "cpu_model": cpu,
        "virtual": virtual,
        "os": os_name,
        "kernel": platform.release(),
        "mem_gib": round(mem_kib / MIB, 1),
    }


def runsc_version() -> str:
    """``runsc --version``'s first line, without the prefix."""
    done = subprocess.run([str(RUNSC), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].removeprefix("runsc version ") if done.stdout else "?"


def sdk_version() -> str | None:
    """The installed e2b SDK's version (the package has no ``__version__``)."""
    try:
        return version("e2b")
    except PackageNotFoundError:
        return None


def measured_on() -> dict[str, Any]:
    """The head of a node benchmark's ``meta``: date, machine, runsc, Python, SDK (that order).

    Imports the SDK: callers run this after parsing arguments (``--help`` need not pay for the
    import) and before timing anything (nor should a first timed create).
    """
    import e2b  # noqa: F401

    return {
        "date": utc_now(),
        "machine": machine(),
        "runsc": runsc_version(),
        "python": platform.python_version(),
        "sdk": sdk_version(),
    }


def arg_strings(args: argparse.Namespace) -> dict[str, str]:
    """The command line as recorded in ``meta.args``."""
    return {k: str(v) for k, v in vars(args).items()}


def loadavg(values: Sequence[float] | None = None) -> list[float]:
    """Load averages (1, 5, 15 min) as recorded in ``meta``; now unless ``values`` are given."""
    return [round(x, 2) for x in (os.getloadavg() if values is None else values)]


def environment(meta: Mapping[str, Any]) -> str:
    """A node report's first words: machine; date; runsc; client SDK and Python."""
    return (
        f"{meta['machine']['description']}; {meta['date']}; runsc {meta['runsc']}; "
        f"client e2b {meta['sdk']} (Python {meta['python']})"
    )


def load_line(meta: Mapping[str, Any]) -> str:
    """Load before and after the run and at the start of each part (a list, or by part name)."""
    during = meta.get("loadavg_during", [])
    at_start = (
        ", ".join(f"{k} {v:.1f}" for k, v in during.items())
        if isinstance(during, Mapping)
        else ", ".join(f"{x:.1f}" for x in during)
    )
    return (
        f"Load average (1 min) before/after: {meta['loadavg_before'][0]}/"
        f"{meta['loadavg_after'][0]}; at the start of each part: {at_start}"
    )
