"""Giving the blocks freed in the workspace pool back to the host file system.

Owns no path: it runs ``fstrim`` on the pool (``<home>/workspaces``) when it is our loop-mounted
XFS image (:mod:`aenv.storage.reflink_fs`), and reads the image's allocated size to decide when.
A pool that is a directory of the host's own file system (or an operator's disk) needs none of
this: a file deleted there frees host space at once.

Every layer a freed block crosses on its way back to the host, and what carries it:

1. A guest deletes a file: the gofer unlinks it in the sandbox's overlay upper, on the ext4 of
   the sandbox's image, mounted ``discard``
   (:data:`aenv.storage.workspace_mounts.EXT4_MOUNT_OPTIONS`): ext4 discards the extents at its
   next journal commit (≤ 5 s), and the sandbox's loop device turns each discard into a hole
   punched in its image file. The pool XFS has the blocks back.
2. A sandbox's image is deleted (kill), or a fork child's, a snapshot's or a pinned clone: the
   pool XFS has the blocks back.
3. From the pool XFS to the host: only a discard from XFS makes the pool's loop device punch the
   hole in ``workspaces.xfs``. Mounted ``discard`` (as :class:`aenv.storage.reflink_fs.ReflinkPool`
   mounts it), XFS sends them once its log checkpoints, which its log worker forces only every
   ~30 s (measured: 13-31 s); a pool mounted by an older aenv has no ``discard`` and XFS ignores
   ``remount,discard``, so there they never come. ``fstrim`` forces the log and discards every
   free extent: measured here 0.2 s for a freshly deleted 1 GiB, 3-30 ms when nothing is left.

So :class:`PoolTrimmer` trims right after a workspace is removed or detached (kill, pause) and
whenever a poll finds the image holding more on the host than the pool uses, beyond what the
last trim left (a guest's deletes, deleted snapshots; a removed image's blocks, which the
kernel frees a moment after the remove: polled for fast for a few seconds after a request).
Off the event loop and off the caller's path: a kill only sets an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from aenv.core import proc
from aenv.core.errors import AenvError, FailedPrecondition
from aenv.storage import loopdev
from aenv.storage.reflink_fs import ReflinkPool

#: A trim is due once the image holds this much more on the host than after the last one.
TRIM_SLACK_BYTES = 32 << 20
#: fstrim of a pool whose free space was discarded already takes milliseconds; even a first
#: trim of a 1 TiB pool punches holes only; minutes mean a hung host disk.
FSTRIM_TIMEOUT_S = 300.0
#: After a failed trim, wait this long before the next try (a broken fstrim must not spin).
_RETRY_S = 60.0
#: A deleted image's blocks are freed when the kernel drops the file's last reference, which
#: the loop device that backed it drops from a workqueue: measured 0.05-2 s after the remove
#: returned, more under load. So after a request the pool is looked at this often, for this long.
_AFTER_REQUEST_POLL_S = 0.25
_AFTER_REQUEST_FOR_S = 30.0

log = logging.getLogger("aenv.storage.pool_trim")


class PoolTrimmer:
    """Trims the pool image of one :class:`ReflinkPool` when blocks were freed in it."""

    def __init__(self, pool: ReflinkPool, *, interval_s: float = 5.0) -> None:
        self.pool = pool
        #: How often :meth:`run` looks for freed blocks not given back (0: only when asked).
        self.interval_s = interval_s
        self._asked = asyncio.Event()
        self._trimming = asyncio.Lock()
        #: :meth:`slack_bytes` right after the last trim (the XFS log and metadata, mostly).
        self._slack_after_trim: int | None = None
        #: Until then (monotonic) :meth:`run` polls every :data:`_AFTER_REQUEST_POLL_S`.
        self._eager_until = 0.0

    @property
    def enabled(self) -> bool:
        """Whether the pool is our loop-mounted image (only then is there anything to trim)."""
        try:
            return self.pool.state.kind == "image"
        except FailedPrecondition:
            return False

    def request(self) -> None:
        """Ask for a trim soon (a workspace was removed or detached); never blocks, never fails."""
        self._asked.set()

    def slack_bytes(self) -> int:
        """Bytes the pool image holds on the host beyond what the pool's file system uses
        (blocking: a stat and a statvfs). It grows with blocks freed and not yet discarded."""
        held = os.stat(self.pool.image).st_blocks * 512
        st = os.statvfs(self.pool.path)
        return held - (st.f_blocks - st.f_bfree) * st.f_frsize

    def due(self) -> bool:
        """Whether freed blocks wait to be given back (blocking: see :meth:`slack_bytes`)."""
        if self._slack_after_trim is None:
            return True  # a pool from an earlier server may hold freed blocks
        return self.slack_bytes() - self._slack_after_trim > TRIM_SLACK_BYTES

    async def trim(self) -> int:
        """``fstrim`` the pool now; the bytes its image gave back to the host.

        Prerequisites: the pool is started. On success: every block free in the pool is a hole
        in its image (a no-op, returning 0, for a pool that is not an image).
        On failure: ``CommandError`` (fstrim failed or timed out), :class:`FailedPrecondition`
        if fstrim is missing; nothing is lost, the blocks stay taken until the next trim.
        """
        if not self.enabled:
            return 0
        fstrim = loopdev.require_tool("fstrim", "util-linux")
        async with self._trimming:
            before = await asyncio.to_thread(_held, self.pool)
            await proc.run([fstrim, str(self.pool.path)], timeout=FSTRIM_TIMEOUT_S)
            after = await asyncio.to_thread(_held, self.pool)
            self._slack_after_trim = await asyncio.to_thread(self.slack_bytes)
        return max(0, before - after)

    async def run(self) -> None:
        """Trim when asked and when a poll finds freed blocks, until cancelled (a background
        task of the node). Failures are logged and retried; they never end the loop."""
        if not self.enabled:
            return
        while True:
            asked = await self._wait()
            try:
                if asked or await asyncio.to_thread(self.due):
                    freed = await self.trim()
                    if freed:
                        log.info("gave %d MiB of freed workspace blocks back to the host",
                                 freed >> 20)
            except (AenvError, OSError) as exc:
                log.warning("trimming the workspace pool %s failed (%s); retrying in %.0f s",
                            self.pool.path, getattr(exc, "message", exc), _RETRY_S)
                await asyncio.sleep(_RETRY_S)

    async def _wait(self) -> bool:
        """Until asked (True) or the poll interval passed (False)."""
        eager = time.monotonic() < self._eager_until
        timeout = _AFTER_REQUEST_POLL_S if eager else self.interval_s
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._asked.wait()
        else:
            await self._asked.wait()
        asked = self._asked.is_set()
        self._asked.clear()
        if asked:
            self._eager_until = time.monotonic() + _AFTER_REQUEST_FOR_S
        return asked


def _held(pool: ReflinkPool) -> int:
    return os.stat(pool.image).st_blocks * 512
