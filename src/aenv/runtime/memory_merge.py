"""Memory merging (KSM) for the sandboxes' processes, when ``memory_merge`` is on.

The kernel merges identical pages only of processes that opted in. ``prctl(PR_SET_MEMORY_MERGE)``
opts in a process and everything it starts from then on (inherited across ``fork`` and kept
across ``execve``: measured, every runsc process of every sandbox says ``ksm_merge_any: yes``),
so the node opts itself in once, before it starts any sandbox, and turns the host's ``ksmd``
on. What it gives and costs is measured in docs/density.md; why it is off by default is the
setting's docstring.

Owns: nothing. Changes, host-wide and left so at shutdown (another node on the host may rely
on it): ``/sys/kernel/mm/ksm/run`` = 1.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

from aenv.core.errors import FailedPrecondition

log = logging.getLogger("aenv.runtime.memory_merge")

#: ``<linux/prctl.h>`` (Linux 6.4).
PR_SET_MEMORY_MERGE = 67
PR_GET_MEMORY_MERGE = 68
KSM_DIR = Path("/sys/kernel/mm/ksm")


def opt_in(ksm_dir: Path = KSM_DIR) -> None:
    """Opt this process and its future children in, and make sure ksmd runs.
    On failure: :class:`FailedPrecondition` (a kernel without KSM or the prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        raise FailedPrecondition(
            f"memory_merge: prctl(PR_SET_MEMORY_MERGE) failed ({ctypes.get_errno()}); the "
            "kernel needs KSM and Linux 6.4 or later")
    run = ksm_dir / "run"
    try:
        if run.read_text().strip() != "1":
            run.write_text("1\n")
            log.info("memory_merge: turned the host's KSM on (%s)", run)
    except OSError as exc:
        raise FailedPrecondition(f"memory_merge: cannot turn KSM on at {run}: {exc}") from exc


def opted_in() -> bool:
    """Whether this process is opted in."""
    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) == 1)
