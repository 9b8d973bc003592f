"""Snapshots answered before their commit, from the answer until their manifest is put.

A snapshot is acknowledged once its image is staged on this node, and its commit
(``storage/pending_commits.py``) follows behind the answer. Meanwhile the snapshot exists only
here, yet the caller may use it at once: a create restores from its staged image, a read waits
for its commit, GC keeps its image. Keeping that in-between state in one place lets the
repository (``storage/repository.py``) deal with committed snapshots alone.

The order of what happens behind the answer matters for what a restart finds: a disk clone is
exported first, in its sandbox's turn (``storage/disk_exports.py``), and the exported image is
written into the order before the clone becomes the sandbox's pin, so a restart commits those
chunks and never looks for the clone the pin took. After a stop, commits whose clone is still
to export wait for the workspace pool to be mounted (a reboot leaves it unmounted when the
repository starts, and a clone missing then drops its snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from aenv.core.errors import AlreadyExists, FailedPrecondition
from aenv.storage.manifest import DiskImage, SnapshotDraft, is_snapshot_id
from aenv.storage.manifest_index import ManifestIndex, Snapshot, manifest_key
from aenv.storage.materialize import LocalCopies, Materialized
from aenv.storage.pending_commits import CommitOrder, Committer, PendingCommits

if TYPE_CHECKING:  # the repository owns this and imports it
    from aenv.storage.repository import SnapshotRepository, Staged

log = logging.getLogger("aenv.storage.answered")


class AnsweredSnapshots:
    def __init__(self, repository: SnapshotRepository, manifests: ManifestIndex,
                 local: LocalCopies) -> None:
        #: Commits (:meth:`SnapshotRepository.commit`), asks its store, runs its disk exports.
        self._repository = repository
        self._manifests = manifests
        self._local = local
        self._pending = PendingCommits()
        #: Answered before a stop, their disk not exported yet: see :meth:`start_exports`.
        self._unexported: list[tuple[Staged, CommitOrder]] = []

    async def seal(self, staged: Staged, order: CommitOrder) -> None:
        """Write ``order`` beside its staged image and start its commit (the work of
        :meth:`SnapshotRepository.commit_later` once the snapshot is checked new)."""
        snapshot_id = order.draft.snapshot_id
        if snapshot_id in self._pending:
            raise AlreadyExists(f"snapshot {snapshot_id} already exists")
        # One request before the promise: a store that does not answer fails the snapshot
        # now (503, as a commit would), not a read of it later; and the id is free.
        if await self._repository.store.head(manifest_key(snapshot_id)) is not None:
            raise AlreadyExists(f"snapshot {snapshot_id} already exists")
        await asyncio.to_thread(order.write, staged.path)
        self._submit(staged, order)

    @staticmethod
    def sealed_order(staged: Staged) -> CommitOrder | None:
        """The order sealed beside ``staged``'s image if it holds a snapshot answered before
        the node stopped (its commit is then finished by :meth:`resume`), else None."""
        order = CommitOrder.read(staged.path) if is_snapshot_id(staged.snapshot_id) else None
        return order if order is not None and order.draft.snapshot_id == staged.snapshot_id \
            else None

    def resume(self, sealed: Iterable[tuple[Staged, CommitOrder]]) -> None:
        """Finish the commits of snapshots answered before the node stopped
        (:meth:`sealed_order`), once the index is loaded; those with a disk clone still to
        export wait for :meth:`start_exports`."""
        for staged, order in sealed:
            if order.disk is None and order.disk_export is not None:
                # Its disk clone is on the workspace pool, which may not be mounted yet.
                self._unexported.append((staged, order))
                continue
            log.info("finishing the commit of snapshot %s, answered before the node stopped",
                     staged.snapshot_id)
            self._submit(staged, order)

    def start_exports(self) -> None:
        """Finish the commits a stop left that still have a disk clone to export: call once
        the workspace pool is mounted (the clones are on it; one missing then is gone, and
        its snapshot is dropped with an error in the log)."""
        for staged, order in self._unexported:
            log.info("finishing the commit of snapshot %s (its disk's export first), "
                     "answered before the node stopped", staged.snapshot_id)
            self._submit(staged, order)
        self._unexported.clear()

    async def close(self) -> None:
        """Let the commits in flight finish (for a while; the rest at the next start)."""
        await self._pending.close()

    def _submit(self, staged: Staged, order: CommitOrder) -> None:
        exports = self._repository.disk_exports
        export = order.disk_export if order.disk is None else None
        if export is None:
            self._pending.submit(order, self._committer(staged), where=staged.path)
            return
        exports.hold(export)
        self._pending.submit(order, self._committer(staged), where=staged.path,
                             ended=lambda: exports.release(export))

    def _committer(self, staged: Staged) -> Committer:
        repository = self._repository
        exported: list[CommitOrder] = []  # the order once its disk is exported

        async def export_disk(order: CommitOrder) -> CommitOrder:
            if order.disk is not None or order.disk_export is None:
                return order
            if exported:
                return exported[0]
            if not await asyncio.to_thread(Path(order.disk_export.clone).is_file):
                raise FailedPrecondition(f"snapshot {order.draft.snapshot_id}: its disk clone "
                                         f"{order.disk_export.clone} is gone")

            async def write_down(disk: DiskImage) -> None:
                # Before the clone becomes the pin: a restart then commits these chunks,
                # and never looks for the clone the pin took.
                done = order.model_copy(update={"disk": disk})
                await asyncio.to_thread(done.write, staged.path)
                exported.append(done)

            await repository.disk_exports.export(order.disk_export, write_down)
            return exported[0]

        async def commit(order: CommitOrder) -> Snapshot:
            order = await export_disk(order)
            snapshot_id = order.draft.snapshot_id
            if order.disk_export is not None:
                # Exported before a crash that came before the clone became the pin.
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(Path(order.disk_export.clone).unlink)
            try:
                return await repository.commit(
                    staged, order.draft, layers=[Path(p) for p in order.layers],
                    envd_bundle=Path(order.envd_bundle), disk=order.disk)
            except AlreadyExists:
                # A try before this one (or before a crash) put the manifest already.
                snapshot = await self._manifests.load(snapshot_id)
                if snapshot is None or snapshot.manifest.source_sandbox_id != \
                        order.draft.source_sandbox_id:
                    raise
                self._manifests.add(snapshot)
                if snapshot.manifest.memory:
                    await asyncio.to_thread(self._local.link_image, snapshot.manifest)
                await repository.discard(staged)
                return snapshot
        return commit

    # -- what is still pending ----------------------------------------------------------------

    async def settle(self, name_or_id: str | None = None) -> None:
        """Wait for the pending commits a read of ``name_or_id`` may see (None: all): then
        the index holds them. ``Unavailable`` if one failed (it is tried again)."""
        await self._pending.settle(name_or_id)

    def pending(self, snapshot_id: str) -> bool:
        """Whether ``snapshot_id`` was answered and is being committed."""
        return snapshot_id in self._pending

    def pending_clones(self) -> set[str]:
        """The disk clones pending commits have still to export (paths)."""
        return {o.disk_export.clone for o in self._pending.orders()
                if o.disk_export is not None and o.disk is None}

    def pending_draft(self, name_or_id: str) -> SnapshotDraft | None:
        """The newest snapshot answered here under this id or name and still being
        committed (its manifest without the blobs), or None."""
        found = self._pending.newest(name_or_id)
        return None if found is None else found[0].draft

    async def materialize_pending(
        self, name_or_id: str, disk_dir: Path | None
    ) -> tuple[SnapshotDraft, Materialized] | None:
        """A snapshot answered here and still being committed, usable at once: a restore
        reads the staged memory image (linked into ``<images>/<id>/``, where its commit
        leaves the same files), the source's layers and bundle, and the local clone of its
        disk in ``disk_dir``; no wait for the commit or the disk's export.

        None when nothing is pending under ``name_or_id``, or its commit ended meanwhile:
        then :meth:`SnapshotRepository.lookup` finds it committed.
        """
        found = self._pending.newest(name_or_id)
        if found is None:
            return None
        order, where = found
        draft = order.draft
        disk = None
        if order.disk is not None or order.disk_export is not None:
            disk = None if disk_dir is None else disk_dir / f"{draft.snapshot_id}.img"
            if disk is None or not disk.is_file():
                return None  # the lookup's path answers why
        try:
            image = await asyncio.to_thread(self._local.link_staged, draft.snapshot_id,
                                            where / "memory")
        except FileNotFoundError:
            return None  # committed meanwhile: the staged directory is gone
        return draft, Materialized(image, tuple(Path(p) for p in order.layers),
                                   Path(order.envd_bundle), disk)
