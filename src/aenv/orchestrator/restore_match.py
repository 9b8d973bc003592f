"""What a memory image needs of the host that restores it, and the check that refuses a mismatch.

A runsc memory image restores only under the runsc build, platform and overlay medium that
saved it, on a CPU with at least the features it was saved with; otherwise runsc fails late
and obscurely (a Go panic over urpc, or a guest that dies on its first vector instruction).
Every manifest with a memory image records :func:`host_requirements` of the node that made it;
:func:`check` compares them with this node's before any restore and raises a clear
:class:`FailedPrecondition` naming what differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import FailedPrecondition
from aenv.runtime.base import Runtime
from aenv.runtime.gvisor import GvisorRuntime

#: Keys compared for equality; ``cpu_flags`` is compared as a set (the host may have more).
_EXACT = ("runtime", "runsc", "platform", "overlay2")


async def host_requirements(runtime: Runtime) -> dict[str, str]:
    """This node's side of the match: runtime, runsc build, platform, overlay, CPU flags."""
    found = {"runtime": runtime.name, "cpu_flags": " ".join(sorted(_cpu_flags()))}
    if isinstance(runtime, GvisorRuntime):
        config = runtime.config
        result = await proc.run([str(config.runsc), "--version"], timeout=30)
        found["runsc"] = result.stdout.decode(errors="replace").splitlines()[0].strip()
        found["platform"] = config.platform
        found["overlay2"] = config.overlay2
    return found


def requirements_key(requirements: Mapping[str, str]) -> str:
    """A short stable hash of the requirements (part of template image ids)."""
    text = "\n".join(f"{k}={requirements[k]}" for k in sorted(requirements))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def check(snapshot_id: str, wanted: Mapping[str, str], host: Mapping[str, str]) -> None:
    """Raise :class:`FailedPrecondition` if this host cannot restore an image made under
    ``wanted``. Keys either side lacks are not compared (older manifests record fewer)."""
    for key in _EXACT:
        if key in wanted and key in host and wanted[key] != host[key]:
            raise FailedPrecondition(
                f"snapshot {snapshot_id} was saved with {key} {wanted[key]!r}; this node has "
                f"{host[key]!r}, so it cannot be restored here")
    if "cpu_flags" in wanted and "cpu_flags" in host:
        missing = set(wanted["cpu_flags"].split()) - set(host["cpu_flags"].split())
        if missing:
            raise FailedPrecondition(
                f"snapshot {snapshot_id} was saved on a CPU with features this node lacks: "
                f"{' '.join(sorted(missing)[:12])}")


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()
