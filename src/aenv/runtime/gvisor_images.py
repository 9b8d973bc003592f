"""What the gVisor driver knows about its memory images that the layers above must not.

A runsc image restores only under the runsc build, platform and overlay medium that saved it
(otherwise runsc fails late and obscurely: a Go panic over urpc); :func:`requirements` names
them for the manifest. An image is complete once its state and pages files have bytes and its
pages index exists; a ``runsc checkpoint`` started by an earlier server process may still be
writing one (it outlives a ``kill -9`` of the server), which :func:`checkpoint_running` sees.
"""

from __future__ import annotations

from pathlib import Path

from aenv.core import proc
from aenv.runtime.base import IMAGE_FILES


async def requirements(runsc: Path, platform: str, overlay2: str) -> dict[str, str]:
    result = await proc.run([str(runsc), "--version"], timeout=30)
    build = result.stdout.decode(errors="replace").splitlines()[0].strip()
    return {"runsc": build, "platform": platform, "overlay2": overlay2}


def complete(path: Path) -> bool:
    state, pages_meta, pages = (path / name for name in IMAGE_FILES)
    return (state.is_file() and state.stat().st_size > 0 and pages_meta.is_file()
            and pages_meta.stat().st_size > 0 and pages.is_file())


def checkpoint_running(sandbox_ids: set[str]) -> bool:
    """Is a ``runsc … checkpoint … <id>`` process running for one of ``sandbox_ids``?"""
    wanted = {sid.encode() for sid in sandbox_ids}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"checkpoint" in argv and wanted.intersection(argv):
            return True
    return False
