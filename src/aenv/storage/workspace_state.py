"""Reading the workspace pool's state: which images exist, what is attached, what is committed.

Pure reads of the pool directory, ``/proc/self/mountinfo`` and ``/sys/block/loop*`` (no
subprocess, no writes), so crash recovery can observe, plan and then apply. The layout is
:mod:`aenv.storage.workspaces`'; the names it shares with it live here.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from aenv.storage import loopdev
from aenv.storage.files import listdir
from aenv.storage.mounts import read_mountinfo

#: ``<pool>/.blank/<size_mb>.img``: blank images, cloned by every create, never written.
BLANK = ".blank"
#: ``<pool>/.staging/``: images being made, linked into place when complete.
STAGING = ".staging"
#: ``<pool>/<sandbox_id>.img``: a workspace.
SUFFIX = ".img"


@dataclass(frozen=True)
class WorkspaceObservation:
    """What the disk, the mount table and the loop devices say (crash recovery's input)."""

    #: Sandbox id -> image size in bytes, for every ``<pool>/<id>.img``.
    images: dict[str, int]
    #: Sandbox id -> loop devices backed by its image (normally one while attached, else none).
    loops: dict[str, tuple[str, ...]]
    #: Sandbox id -> device mounted at ``workspaces-mnt/<id>``.
    mounted: dict[str, str]
    #: Loop devices on pool files that are not workspaces (deleted, staging, blanks).
    orphan_loops: tuple[str, ...]
    #: Files in ``.staging`` (a create or clone in flight, or a crashed one).
    staging: tuple[str, ...]


def _is_workspace_name(name: str) -> bool:
    return name.endswith(SUFFIX) and not name.startswith(".")


def observe(pool: Path, mounts_root: Path) -> WorkspaceObservation:
    """Every workspace image in ``pool``, the loop devices on pool files, and the mounts under
    ``mounts_root`` (both paths real, as the kernel reports them)."""
    images: dict[str, int] = {}
    for name in listdir(pool):
        if _is_workspace_name(name):
            with contextlib.suppress(FileNotFoundError):
                images[name.removesuffix(SUFFIX)] = (pool / name).stat().st_size
    loops: dict[str, list[str]] = {}
    orphans: list[str] = []
    prefix = str(pool) + "/"
    for loop in loopdev.loops_under(pool):
        rel = loop.backing_file.removeprefix(prefix)
        if loop.deleted or "/" in rel or not _is_workspace_name(rel):
            orphans.append(loop.device)
        else:
            loops.setdefault(rel.removesuffix(SUFFIX), []).append(loop.device)
    mounted: dict[str, str] = {}
    root = str(mounts_root) + "/"
    for m in read_mountinfo():
        name = m.mount_point.removeprefix(root)
        if m.mount_point.startswith(root) and "/" not in name:
            mounted[name] = m.source
    return WorkspaceObservation(
        images=images,
        loops={k: tuple(v) for k, v in loops.items()},
        mounted=mounted,
        orphan_loops=tuple(orphans),
        staging=tuple(sorted(listdir(pool / STAGING))),
    )


def committed_bytes(pool: Path) -> int:
    """The most the files in ``pool`` can ever occupy: writable images (workspaces) at their full
    size, every other file (snapshots, blanks, staging) at what it holds now, since nothing
    writes them. Sound because every block in use belongs to some file and a writable image
    never maps more blocks than its size, however many of them it shares today. Conservative:
    a block shared by a snapshot and its source counts twice (the source may overwrite it)."""
    total = 0
    for dirpath, _dirs, files in os.walk(pool):
        top = dirpath == str(pool)
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_size if top and _is_workspace_name(name) else st.st_blocks * 512
    return total
