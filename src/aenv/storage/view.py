"""A read-only merged view of a layer stack, for looking into an image from the host.

Owns ``<scratch>/view-<random>/`` while the context is open: a read-only overlayfs mount of the
lowers (no upper: nothing can be written through it), unmounted and removed on exit. One layer
needs no mount: its directory is the view (callers only read it). Template builds use views to
read ``/etc/passwd``, a COPY destination's parents and ``COPY --from`` sources; every read
through a view must still resolve symlinks inside it (``storage/image_files.py``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from aenv.core import proc
from aenv.storage.mounts import MOUNT_TIMEOUT_S, unmount
from aenv.storage.overlay import check_lowers, common_parent


@contextlib.asynccontextmanager
async def merged_view(lowers: Sequence[Path], scratch: Path) -> AsyncIterator[Path]:
    """Inside: a directory showing ``lowers`` (lowest first) merged, read-only.

    On failure: ``NotFound``/``InvalidArgument`` for bad lowers (as ``RootfsStore.assemble``),
    ``CommandError`` if the mount fails.
    """
    checked = check_lowers(lowers)
    if len(checked) == 1:
        yield checked[0]
        return
    scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / f"view-{secrets.token_hex(6)}"
    target.mkdir(0o700)
    parent = common_parent(checked)
    lowerdir = ":".join(os.path.relpath(p, parent) for p in reversed(checked))
    try:
        await proc.run(
            ["mount", "-t", "overlay", "aenv-view", "-o",
             f"ro,lowerdir={lowerdir},index=off,metacopy=off,redirect_dir=off", str(target)],
            timeout=MOUNT_TIMEOUT_S, cwd=parent,
        )
        try:
            yield target
        finally:
            await unmount(str(target), lazy=True, what="a layer view")
    finally:
        with contextlib.suppress(OSError):
            target.rmdir()
