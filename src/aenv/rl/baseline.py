"""The prepared state's files, read for the old side of rollout diffs while the prepared
parent stays paused.

A pool that creates its rollouts from a snapshot of the prepared parent pauses the parent:
a running parent costs environment-seconds through every wave and is needed by nothing but
the diffs. A diff needs the parent's version of each text file a rollout changed; this reads
it once per path (resuming the parent for the first read a wave needs, and caching what it
read: rollouts of one task tend to change the same files), and :meth:`Baseline.rest` pauses
the parent again once no read is in flight. The manifest (``diff.Manifest``) is taken
the same way, when the first diff needs it: a pool whose runs compute no diffs never pays the
seconds of hashing the task's roots. A pause keeps the files, so what is read is still the
prepared state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aenv.client import ClientError, Sandbox
from aenv.rl.diff import Manifest, take_manifest

log = logging.getLogger("aenv.rl")

#: Old sides kept per task: a file is cached only while the cache is below this many bytes.
CACHE_BYTES = 64 * 1024 * 1024


class Baseline:
    """``read_file`` of the prepared parent, which may be paused between reads."""

    def __init__(self, parent: Sandbox, *, paused: bool, roots: tuple[str, ...],
                 manifest: Manifest | None = None) -> None:
        self.parent = parent
        self.roots = roots
        self._manifest = manifest
        self._manifest_lock = asyncio.Lock()
        self._paused = paused
        #: Whether :meth:`rest` may pause the parent (it was paused when handed over).
        self._rests = paused
        self._lock = asyncio.Lock()
        self._readers = 0
        self._cache: dict[str, str] = {}
        self._cached_bytes = 0

    async def manifest(self) -> Manifest:
        """The prepared state's manifest of the task's roots, taken once."""
        async with self._manifest_lock:
            if self._manifest is None:
                async with self._awake():
                    self._manifest = await take_manifest(self.parent, self.roots)
            return self._manifest

    async def read_file(self, path: str) -> str:
        """The parent's text of ``path``; the client's errors (``NotFound`` …) as a read's."""
        if path in self._cache:
            return self._cache[path]
        async with self._awake():
            text = await self.parent.read_file(path)
        if self._cached_bytes + len(text) <= CACHE_BYTES:
            self._cache[path] = text
            self._cached_bytes += len(text)
        return text

    async def rest(self) -> None:
        """Pause the parent again if a read resumed it and none is in flight; a failed pause
        is logged (the parent then runs until the pool kills it)."""
        async with self._lock:
            if self._paused or not self._rests or self._readers:
                return
            try:
                await self.parent.pause()
            except ClientError as exc:
                log.info("pausing prepared parent %s again failed: %s", self.parent.sandbox_id,
                         exc)
                self._rests = False
                return
            self._paused = True

    @contextlib.asynccontextmanager
    async def _awake(self) -> AsyncIterator[None]:
        async with self._lock:
            if self._paused:
                await self.parent.resume()
                self._paused = False
            self._readers += 1
        try:
            yield
        finally:
            self._readers -= 1
