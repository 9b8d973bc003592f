"""Small file-system steps shared by the layer store and the snapshot repository."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from aenv.core.errors import FailedPrecondition
from aenv.storage.mounts import mounts_under


def listdir(path: Path) -> list[str]:
    """Entry names of ``path``; a missing directory has none."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def fsync_dirs(*paths: Path) -> None:
    """Make entries created or renamed in these directories durable (power cuts included)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def rmtree(path: Path) -> None:
    """Remove a tree (or a file); it being gone already, or a concurrent remover having been
    faster, is not an error. Refuses when anything is mounted inside it."""

    def on_error(func: Any, p: str, exc: BaseException) -> None:
        if isinstance(exc, FileNotFoundError):
            return
        raise exc

    if not os.path.lexists(path):
        return
    # Deleting through a mount point would delete another filesystem's files (as root: /dev,
    # anything); callers detach mounts first, this is the safety net.
    inside = mounts_under(path)
    if inside:
        raise FailedPrecondition(f"refusing to delete {path}: mounted inside it: {inside}")
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=on_error)
    else:
        shutil.rmtree(path, onerror=lambda func, p, info: on_error(func, p, info[1]))
