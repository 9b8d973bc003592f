"""What a memory image needs of the host that restores it, and the check that refuses a mismatch.

A memory image restores only under the runtime that saved it, as that driver says
(``Runtime.image_requirements``: its build, platform, medium …), on a CPU with at least the
features it was saved with; otherwise the restore fails late and obscurely (a guest that dies
on its first vector instruction).
Every manifest with a memory image records :func:`host_requirements` of the node that made it;
:func:`check` compares them with this node's before any restore and raises a clear
:class:`FailedPrecondition` naming what differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from aenv.core.errors import FailedPrecondition
from aenv.runtime.base import Runtime

#: Compared as a set (the host may have more); every other key is compared for equality.
_CPU_FLAGS = "cpu_flags"


async def host_requirements(runtime: Runtime) -> dict[str, str]:
    """This node's side of the match: the runtime's name and requirements, the CPU's flags."""
    return {**await runtime.image_requirements(), "runtime": runtime.name,
            _CPU_FLAGS: " ".join(sorted(_cpu_flags()))}


def requirements_key(requirements: Mapping[str, str]) -> str:
    """A short stable hash of the requirements (part of template image ids)."""
    text = "\n".join(f"{k}={requirements[k]}" for k in sorted(requirements))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def check(snapshot_id: str, wanted: Mapping[str, str], host: Mapping[str, str]) -> None:
    """Raise :class:`FailedPrecondition` if this host cannot restore an image made under
    ``wanted``. Keys either side lacks are not compared (older manifests record fewer)."""
    # The runtime first: another runtime's image differs in everything else too.
    shared = wanted.keys() & host.keys() - {_CPU_FLAGS}
    for key in sorted(shared, key=lambda k: (k != "runtime", k)):
        if wanted[key] != host[key]:
            raise FailedPrecondition(
                f"snapshot {snapshot_id} was saved with {key} {wanted[key]!r}; this node has "
                f"{host[key]!r}, so it cannot be restored here")
    if _CPU_FLAGS in wanted and _CPU_FLAGS in host:
        missing = set(wanted[_CPU_FLAGS].split()) - set(host[_CPU_FLAGS].split())
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
