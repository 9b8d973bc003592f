"""Lifecycle benchmark entry point (the code is in the ``bench.lifecycle`` package).

Other benchmarks import its shared pieces from here (``BareEnvd``, ``LifecycleNode``,
``Report``, ``Row``, ``svg``, ...): they are re-exported as they were.
"""

from __future__ import annotations

import sys

import bench.lifecycle  # noqa: F401  # sets the slot base before the harness reads it
from bench.lifecycle.bare import BareEnvd, rm_image
from bench.lifecycle.common import (
    BARE_CGROUP,
    KEEP_LOG_RE,
    PAUSE_HOT_S,
    REQUEST_TIMEOUT_S,
    SANDBOX_TIMEOUT_S,
    SNAPSHOT_RE,
    Report,
    Row,
    dir_bytes,
    guarded,
    kill_all,
    log,
    p50,
    pss_mib,
    run_true,
)
from bench.lifecycle.fork import ForkRun, node_fork
from bench.lifecycle.main import main
from bench.lifecycle.node import LifecycleNode, start_node
from bench.lifecycle.report import markdown
from bench.lifecycle.svg import svg

__all__ = [
    "BARE_CGROUP",
    "KEEP_LOG_RE",
    "PAUSE_HOT_S",
    "REQUEST_TIMEOUT_S",
    "SANDBOX_TIMEOUT_S",
    "SNAPSHOT_RE",
    "BareEnvd",
    "ForkRun",
    "LifecycleNode",
    "Report",
    "Row",
    "dir_bytes",
    "guarded",
    "kill_all",
    "log",
    "main",
    "markdown",
    "node_fork",
    "p50",
    "pss_mib",
    "rm_image",
    "run_true",
    "start_node",
    "svg",
]

if __name__ == "__main__":
    sys.exit(main())
