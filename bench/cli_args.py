"""What every benchmark's ``main`` does with its arguments and the machine before it measures."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any

#: Above this 1-minute load average before the run, warn that something else competes for CPU.
LOAD_WARN = 0.5


def apply_quick(
    args: argparse.Namespace, parser: argparse.ArgumentParser, quick: Mapping[str, Any]
) -> None:
    """``--quick``: smaller defaults; options given explicitly still win."""
    if not getattr(args, "quick", False):
        return
    for name, value in quick.items():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, value)


def warn_if_loaded(log: Callable[[str], None]) -> tuple[float, float, float]:
    """The load averages now, with a warning when the machine is already busy."""
    load = os.getloadavg()
    if load[0] > LOAD_WARN:
        log(
            f"warning: 1-minute load average is {load[0]:.2f} on {os.cpu_count()} CPUs; "
            "the numbers will be noisy"
        )
    return load
