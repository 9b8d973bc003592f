"""overlayfs as aenv stacks it: which layer directories a stack may hold, and the mount itself.

Owns no path: callers say where (:class:`aenv.storage.rootfs.RootfsStore` for sandboxes' roots,
:func:`aenv.storage.view.merged_view` for read-only looks into an image).

Mounts are made with ``mount -t overlay`` through :func:`aenv.core.proc.run` rather than the
mount syscall through ctypes: a mount costs ~2 ms of fork/exec next to a sandbox boot of hundreds,
util-linux reports errors in words we can pass on, and there is no hand-written syscall ABI to
get wrong. Lower paths are passed relative to their common parent (``cwd`` of the mount
command) because the legacy mount(2) call copies at most one page of options: with 64-character
layer ids that leaves room for ~60 lowers, above which the chain must be compacted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import InvalidArgument, NotFound
from aenv.storage.mounts import MOUNT_TIMEOUT_S

#: Characters overlayfs would parse inside a lowerdir list (``:`` separates lowers, ``,``
#: options, ``\\`` escapes) or that mountinfo escapes; layer paths never need them.
_BAD_PATH_CHARS = re.compile(r"[:,\\\s]")
#: The legacy mount(2) syscall copies at most one page of option data, NUL included.
MOUNT_OPTIONS_MAX = 4095
#: overlayfs refuses deeper stacks (OVL_MAX_STACK in fs/overlayfs).
MAX_LOWERS = 500
#: Fixed options: no index (lowers are shared by many overlays and an upper must be mountable
#: over other lowers later), and neither metacopy nor redirect_dir, so that an upper stays a
#: self-contained tree that can be sealed into a portable lower layer.
_OVERLAY_OPTIONS = "index=off,metacopy=off,redirect_dir=off"
#: Source field of our mounts: makes them recognisable in ``mount`` output.
_MOUNT_SOURCE = "aenv"


def check_lowers(lowers: Iterable[Path]) -> list[Path]:
    """``lowers`` (lowest first) as real paths, if overlayfs can stack them.

    On failure: :class:`InvalidArgument` for none, too many, a repeated one or a path with
    characters overlayfs would parse; :class:`NotFound` if one is not a directory.
    """
    checked: list[Path] = []
    for lower in lowers:
        path = Path(os.path.realpath(lower))
        if _BAD_PATH_CHARS.search(str(path)):
            raise InvalidArgument(f"layer path {str(path)!r} has characters overlayfs cannot take")
        if not path.is_dir():
            raise NotFound(f"layer directory {path} does not exist")
        checked.append(path)
    if not checked:
        raise InvalidArgument("a rootfs needs at least one layer")
    if len(checked) > MAX_LOWERS:
        raise InvalidArgument(f"{len(checked)} layers exceed overlayfs' limit of {MAX_LOWERS}")
    if len(set(checked)) != len(checked):
        raise InvalidArgument("the same layer appears twice in one rootfs")
    return checked


def common_parent(lowers: Sequence[Path]) -> Path:
    """The directory the lowers are named relative to (the mount command's ``cwd``)."""
    common = Path(os.path.commonpath([str(p) for p in lowers]))
    # With one lower (or lowers nested in one another) the common path is a lower itself;
    # relative names are taken from its parent so that none of them is "." .
    if common in lowers:
        common = common.parent
    return common


async def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount ``lowers`` (checked by :func:`check_lowers`, lowest first) under ``upper`` at
    ``target``.

    On failure: :class:`InvalidArgument` when the options do not fit one page (compact the
    layer chain); :class:`aenv.core.errors.CommandError` if ``mount`` fails.
    """
    parent = common_parent(lowers)
    # overlayfs' lowerdir= lists the top layer first.
    lowerdir = ":".join(os.path.relpath(p, parent) for p in reversed(lowers))
    options = f"lowerdir={lowerdir},upperdir={upper},workdir={work},{_OVERLAY_OPTIONS}"
    if len(options.encode()) > MOUNT_OPTIONS_MAX:
        raise InvalidArgument(
            f"{len(lowers)} layers do not fit in one overlay mount ({len(options)} bytes of "
            f"options, max {MOUNT_OPTIONS_MAX}); compact the layer chain"
        )
    argv = ["mount", "-t", "overlay", _MOUNT_SOURCE, "-o", options, str(target)]
    await proc.run(argv, timeout=MOUNT_TIMEOUT_S, cwd=parent)
