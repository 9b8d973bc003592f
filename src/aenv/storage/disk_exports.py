"""Exports of sandboxes' disk clones into chunk blobs, one at a time per sandbox, and the
previous export each keeps for the next one.

An export (``storage/disk_chunks.py``) reads only the chunks whose extents changed since the
sandbox's previous export, whose clone is kept as the sandbox's *pin* and whose chunk table
is its *index*. So two exports of one sandbox must never overlap: the second would compare
against a pin the first is about to replace. A snapshot's export runs after its answer, in
its background commit (``storage/pending_commits.py``), while a pause or a template image
exports before it commits; all of them go through here, in the order they asked.

Owns, per sandbox with exports in flight: their order (a lock) and how many are held (a
snapshot's from its answer to the end of its commit). A sandbox that is gone (killed) while
exports of it are held keeps its pin until the last of them ends; then the pin and the index
go, so a kill never leaves them behind and an export never follows a kill's clean-up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from aenv.storage.blobs import BlobCache
from aenv.storage.disk_chunks import CHUNK_BYTES, DiskExport, export_disk
from aenv.storage.manifest import DiskChunk, DiskImage

log = logging.getLogger("aenv.storage.disk_exports")


class DiskExportOrder(BaseModel):
    """One export: the clone to cut into chunks, and the sandbox's pin and index."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The reflink clone of the disk at the snapshot's instant (on the workspace pool).
    clone: str
    #: The sandbox's previous export's chunk table (``disk_chunks.export_disk``).
    index_file: str
    #: Where the sandbox's previous export's clone is kept; this clone goes there after.
    pin: str
    #: The sandbox, and the snapshot the export is for (for the log).
    sandbox_id: str
    snapshot_id: str


#: Called with the export's image while its order still holds the sandbox's turn, before the
#: clone becomes the pin (a commit writes down the chunks it will publish there).
BeforePin = Callable[[DiskImage], Awaitable[None]]


class DiskExports:
    def __init__(self, cache: BlobCache) -> None:
        self._cache = cache
        self._turns: dict[str, asyncio.Lock] = {}
        self._held: collections.Counter[str] = collections.Counter()
        #: Pins of sandboxes forgotten while exports of them were held.
        self._gone: set[str] = set()

    def hold(self, order: DiskExportOrder) -> None:
        """Count ``order`` as in flight (until :meth:`release`): a forget of its sandbox
        meanwhile waits for it to end."""
        self._held[order.pin] += 1

    def release(self, order: DiskExportOrder) -> None:
        pin = order.pin
        self._held[pin] -= 1
        if self._held[pin] > 0:
            return
        del self._held[pin]
        self._turns.pop(pin, None)  # nobody waits: every waiter holds
        if pin in self._gone:
            self._gone.discard(pin)
            _drop(order.index_file, pin)

    async def export(self, order: DiskExportOrder,
                     before_pin: BeforePin | None = None) -> DiskImage:
        """Cut ``order.clone`` into chunk blobs in the cache, after the sandbox's earlier
        exports; then the clone is the sandbox's pin.

        Prerequisites: ``order`` is held (:meth:`hold`). On success: the chunks are in the
        cache, ``before_pin`` was awaited with the image, the clone is at ``order.pin``. On
        failure: ``OSError`` (the clone missing or unreadable, the cache's disk full); the
        clone stays where it was.
        """
        assert self._held[order.pin] > 0, "export of an order not held"
        async with self._turns.setdefault(order.pin, asyncio.Lock()):
            started = time.monotonic()
            made = await asyncio.to_thread(
                export_disk, Path(order.clone), self._cache, Path(order.index_file),
                Path(order.pin))
            image = _image(made)
            log.info("disk of %s for snapshot %s: %d chunks read, %d unchanged since its last "
                     "snapshot (%.0f ms)", order.sandbox_id, order.snapshot_id, made.read,
                     made.reused, (time.monotonic() - started) * 1000)
            if before_pin is not None:
                await before_pin(image)
            await asyncio.to_thread(Path(order.clone).replace, order.pin)
        return image

    async def export_now(self, order: DiskExportOrder) -> DiskImage:
        """:meth:`export`, held for its own length."""
        self.hold(order)
        try:
            return await self.export(order)
        finally:
            self.release(order)

    def forget(self, index_file: Path, pin: Path) -> None:
        """Drop a gone sandbox's pin and index: now, or when its last held export ends."""
        if self._held.get(str(pin)):
            self._gone.add(str(pin))
            return
        _drop(str(index_file), str(pin))


def _image(made: DiskExport) -> DiskImage:
    return DiskImage(size=made.size, chunk_bytes=CHUNK_BYTES, chunks=[
        DiskChunk(index=c.index, digest=c.digest, size=c.size) for c in made.chunks])


def _drop(index_file: str, pin: str) -> None:
    for path in (pin, index_file):
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()
