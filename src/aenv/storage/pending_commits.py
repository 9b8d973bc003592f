"""Commits that run after the answer: a snapshot is acknowledged once its image is staged on
this node's disk, and its commit to the repository (hashing the image, putting the blobs, the
manifest last) follows here.

What the answer promises holds: the order of the commit is written beside the staged image
(``pending.json``, fsynced) before the answer, so a node killed before the commit finishes it
at its next start (:meth:`aenv.storage.repository.SnapshotRepository.start`); a read of the
snapshot on this node (a create from it, a lookup, a listing, a delete) waits for its pending
commit first, so the id can be used at once; other nodes see it once it is committed.

A commit that fails is tried again with backoff (the repository may be down for a while); a
read that waited for it then answers 503 with the reason. Only an image that can never be
committed (incomplete) is dropped, logged as an error.

Owns: one task per pending commit, cancelled by :meth:`PendingCommits.close` once the
commits have had :data:`CLOSE_S` to finish (a cancelled one stays staged and sealed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from aenv.core.errors import AenvError, FailedPrecondition, Unavailable
from aenv.storage.disk_exports import DiskExportOrder
from aenv.storage.manifest import DiskImage, SnapshotDraft

log = logging.getLogger("aenv.storage.pending_commits")

#: The order of a staged snapshot's commit, in its staging directory.
ORDER_FILE = "pending.json"
#: A failed commit is tried again after this long, doubling up to :data:`RETRY_MAX_S`.
RETRY_S = 1.0
RETRY_MAX_S = 60.0
#: How long a shutdown lets the commits in flight finish before cancelling them.
CLOSE_S = 20.0


class CommitOrder(BaseModel):
    """Everything a staged snapshot's commit needs, kept beside its image."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft: SnapshotDraft
    layers: list[str]
    envd_bundle: str
    disk: DiskImage | None = None
    #: A disk clone still to be exported (into ``disk``) before the blobs are put: the
    #: export runs after the answer too. Once done, the order is written again with ``disk``.
    disk_export: DiskExportOrder | None = None

    def write(self, staging_dir: Path) -> None:
        """Write the order into ``staging_dir`` atomically and durably."""
        temporary = staging_dir / f".{ORDER_FILE}"
        data = self.model_dump_json().encode()
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        temporary.replace(staging_dir / ORDER_FILE)
        directory = os.open(staging_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @classmethod
    def read(cls, staging_dir: Path) -> CommitOrder | None:
        """The order written in ``staging_dir``, or None (none, or unreadable: logged)."""
        path = staging_dir / ORDER_FILE
        try:
            return cls.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            log.error("cannot read the commit order %s: %s", path, str(exc).splitlines()[0])
            return None


#: Commit the staged snapshot ``order`` names.
Committer = Callable[[CommitOrder], Awaitable[object]]


@dataclass
class _Pending:
    order: CommitOrder
    #: Set when the first try ended (done or failed): reads wait for that, not for retries.
    tried: asyncio.Event = field(default_factory=asyncio.Event)
    #: The last try's failure, while it is tried again.
    error: AenvError | None = None
    task: asyncio.Task[None] | None = None
    ended: Callable[[], None] | None = None
    #: The staging directory holding the image and the order.
    where: Path | None = None


class PendingCommits:
    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}

    def __contains__(self, snapshot_id: str) -> bool:
        return snapshot_id in self._pending

    def submit(self, order: CommitOrder, commit: Committer, *, where: Path,
               ended: Callable[[], None] | None = None) -> None:
        """Run ``commit(order)`` (staged in ``where``) until it is done (or can never be,
        or the node stops); then ``ended()``."""
        snapshot_id = order.draft.snapshot_id
        pending = self._pending[snapshot_id] = _Pending(order, ended=ended, where=where)
        pending.task = asyncio.get_running_loop().create_task(
            self._run(pending, commit), name=f"commit {snapshot_id}")

    def orders(self) -> list[CommitOrder]:
        """The orders of every pending commit."""
        return [p.order for p in self._pending.values()]

    def newest(self, name_or_id: str) -> tuple[CommitOrder, Path] | None:
        """The newest pending snapshot with id or name ``name_or_id``, and where it is
        staged; None if none is pending."""
        found = [p for p in self._pending.values()
                 if p.order.draft.snapshot_id == name_or_id or name_or_id in p.order.draft.names]
        if not found:
            return None
        newest = max(found, key=lambda p: p.order.draft.created_at)
        assert newest.where is not None
        return newest.order, newest.where

    async def settle(self, name_or_id: str | None = None) -> None:
        """Wait for the first try of the pending commits a read of ``name_or_id`` may see
        (None: all of them). ``Unavailable`` if one of them failed and is tried again."""
        wanted = [p for p in self._pending.values()
                  if name_or_id is None or p.order.draft.snapshot_id == name_or_id
                  or name_or_id in p.order.draft.names]
        for pending in wanted:
            await pending.tried.wait()
            if pending.error is not None and pending.order.draft.snapshot_id in self._pending:
                raise Unavailable(
                    f"snapshot {pending.order.draft.snapshot_id} is not in the repository yet "
                    f"(its commit failed and is tried again): {pending.error.message}")

    async def close(self) -> None:
        tasks = [p.task for p in self._pending.values() if p.task is not None]
        if not tasks:
            return
        _, left = await asyncio.wait(tasks, timeout=CLOSE_S)
        for task in left:
            task.cancel()
        if left:
            log.warning("%d snapshot commits cut short by the shutdown: the next start "
                        "finishes them", len(left))
            await asyncio.gather(*left, return_exceptions=True)

    async def _run(self, pending: _Pending, commit: Committer) -> None:
        snapshot_id = pending.order.draft.snapshot_id
        delay = RETRY_S
        started = time.monotonic()
        try:
            while True:
                try:
                    await commit(pending.order)
                    log.info("committed snapshot %s %.0f ms after its answer", snapshot_id,
                             (time.monotonic() - started) * 1000)
                    return
                except FailedPrecondition as exc:
                    log.error("snapshot %s cannot be committed, dropped: %s", snapshot_id,
                              exc.message)
                    return
                except Exception as exc:
                    error = exc if isinstance(exc, AenvError) else Unavailable(repr(exc))
                    pending.error = error
                    log.warning("committing snapshot %s failed, next try in %.0f s: %s",
                                snapshot_id, delay, error.message,
                                exc_info=not isinstance(exc, AenvError))
                pending.tried.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        finally:
            self._pending.pop(snapshot_id, None)
            pending.tried.set()
            if pending.ended is not None:
                pending.ended()
