"""The snapshot repository: committed snapshots, templates and paused sandboxes, as manifests
that name content-addressed blobs, in a posix directory or an S3 bucket shared by nodes.

Owns, in the object store (``storage/objects.py``)::

    manifests/<id>.json          one committed snapshot (:class:`SnapshotManifest`)
    blobs/sha256/<hex>           layers (OCI tars), memory-image files, envd bundles

and on this node ``<home>/staging/`` (memory images being written) and ``<home>/cache/images/``
(memory images of committed snapshots, hard links into the blob cache, ready for runsc).

Commit protocol: every blob a manifest names is put first (skipped when already there), then
the manifest is put **last** with a conditional create. A snapshot is visible exactly when its
manifest exists, so a crash at any moment leaves either nothing visible or the whole snapshot;
blobs a crashed writer left behind are unreferenced and reclaimed by GC (``storage/gc.py``).
Delete removes the manifest (atomic); its blobs go with the next GC. Local staging is swept at
start.

Other nodes write the same repository: the index of manifests (``storage/manifest_index.py``)
is refreshed from the store (:meth:`SnapshotRepository.refresh`) when asked for something it
does not know, and at most every :data:`~aenv.storage.manifest_index.REFRESH_S` for listings.
Starting a sandbox from a snapshot made elsewhere first fetches what this node lacks
(:meth:`SnapshotRepository.materialize`), digests checked.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from aenv.core.faults import fault
from aenv.storage.answered import AnsweredSnapshots
from aenv.storage.artifacts import Artifacts
from aenv.storage.blobs import BlobCache, BlobRef, blob_key
from aenv.storage.commit_gate import CommitGate
from aenv.storage.disk_exports import DiskExportOrder, DiskExports
from aenv.storage.files import listdir, rmtree
from aenv.storage.gc import DEFAULT_GRACE_S, CollectionPlan, plan_collection
from aenv.storage.manifest import (
    IMAGE_FILES,
    MANIFEST_FORMAT,
    Blob,
    DiskImage,
    MemoryFile,
    SnapshotDraft,
    SnapshotManifest,
    check_snapshot_id,
    is_snapshot_id,
)
from aenv.storage.manifest_index import ManifestIndex, Snapshot, manifest_key
from aenv.storage.materialize import LocalCopies, Materialized
from aenv.storage.objects import ObjectStore
from aenv.storage.pending_commits import CommitOrder

__all__ = [
    "IMAGE_FILES",
    "MANIFEST_FORMAT",
    "Materialized",
    "Snapshot",
    "SnapshotDraft",
    "SnapshotManifest",
    "SnapshotRepository",
    "Staged",
    "check_snapshot_id",
    "is_snapshot_id",
    "manifest_key",
]

log = logging.getLogger("aenv.storage.repository")

BLOB_LIST_PREFIX = "blobs/"
#: Blob puts one commit runs at once.
PUT_CONCURRENCY = 4
#: HEAD requests of the re-check at once (small requests: more of them in flight).
CHECK_CONCURRENCY = 16


@dataclass(frozen=True)
class Staged:
    """A snapshot being written: a private directory in staging, invisible until committed."""

    snapshot_id: str
    #: ``<staging>/<snapshot_id>.<random>``.
    path: Path

    @property
    def memory_dir(self) -> Path:
        """Where the checkpoint must write the memory image; :meth:`SnapshotRepository.stage`
        does not create it (runsc's checkpoint creates its image directory)."""
        return self.path / "memory"


class SnapshotRepository:
    def __init__(
        self, store: ObjectStore, artifacts: Artifacts, staging: Path, images: Path
    ) -> None:
        self.store = store
        self.artifacts = artifacts
        self.cache: BlobCache = artifacts.cache
        #: ``<home>/staging``.
        self.staging = Path(staging)
        #: ``<home>/cache/images``.
        self.images = Path(images)
        #: The committed manifests, as last read from the store (``storage/manifest_index.py``).
        self._manifests = ManifestIndex(store)
        self._committing: set[str] = set()
        #: Blob digests this process put, or found in the store, since its last GC pass: a
        #: commit does not ask for them again before its manifest (the re-check after it
        #: covers a GC elsewhere, as for blobs a manifest names).
        self._present: set[str] = set()
        self._local = LocalCopies(store, artifacts, self.images)
        self._gate = CommitGate()
        #: Sandboxes' disk exports, in order per sandbox (a snapshot's after its answer).
        self.disk_exports = DiskExports(self.cache)
        #: Snapshots already answered, until committed (:meth:`commit_later`).
        self._answered = AnsweredSnapshots(self, self._manifests, self._local)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> builtins.list[str]:
        """Sweep local leftovers and load the index.

        Prerequisites: no other process uses this node's staging directory (the node lock).
        On success: staging holds only snapshots answered before a stop, whose commits are
        under way again (those with a disk still to export wait for :meth:`start_exports`);
        what a crash mid-snapshot left is removed; the index holds every committed manifest
        that parses; returns the local paths removed.
        On failure: :class:`Unavailable` if the store cannot be listed (the node does not start
        on a repository it cannot read); ``OSError`` for local I/O errors.
        """
        removed: list[str] = []
        for directory in (self.staging, self.images):
            directory.mkdir(parents=True, exist_ok=True)
        sealed: list[tuple[Staged, CommitOrder]] = []
        for name in sorted(listdir(self.staging)):
            staged = Staged(name.partition(".")[0], self.staging / name)
            if (order := self._answered.sealed_order(staged)) is not None:
                sealed.append((staged, order))  # answered before a crash: commit it now
                continue
            rmtree(self.staging / name)
            removed.append(str(self.staging / name))
            log.info("removed leftover %s", self.staging / name)
        removed.extend(self.cache.start())
        self.artifacts.start()
        await self.refresh(force=True)
        self._answered.resume(sealed)
        return removed

    def start_exports(self) -> None:
        """Call once the workspace pool is mounted (``storage/answered.py``)."""
        self._answered.start_exports()

    async def close(self) -> None:
        """Let the commits in flight finish (for a while; the rest at the next start)."""
        await self._answered.close()

    # -- writing ------------------------------------------------------------------------------

    def stage(self, snapshot_id: str) -> Staged:
        """A new, empty, private staging directory for snapshot ``snapshot_id``.

        On success: ``<staging>/<id>.<random>/`` exists, empty, mode 0700 (a memory image holds
        the sandbox's secrets). Commit it with :meth:`commit` or drop it with :meth:`discard`;
        if the process dies first, the next :meth:`start` removes it.
        On failure: :class:`InvalidArgument` for a malformed id; ``OSError``.
        """
        check_snapshot_id(snapshot_id)
        self.staging.mkdir(parents=True, exist_ok=True)
        path = self.staging / f"{snapshot_id}.{secrets.token_hex(6)}"
        path.mkdir(0o700)
        path.chmod(0o700)  # never let umask decide who can read a memory image
        return Staged(snapshot_id, path)

    async def commit(
        self,
        staged: Staged,
        draft: SnapshotDraft,
        *,
        layers: Sequence[Path],
        envd_bundle: Path,
        memory: bool = True,
        memory_dir: Path | None = None,
        disk: DiskImage | None = None,
    ) -> Snapshot:
        """Publish the staged snapshot under its id: blobs first, the manifest last.

        ``draft`` is the manifest without its blobs (``layers``, ``memory`` and
        ``envd_bundle`` are filled in here from the local ``layers``, ``envd_bundle`` and
        ``staged.memory_dir``, or ``memory_dir`` if given: an image kept elsewhere, linked,
        never moved; ``memory=False``: a filesystem-only snapshot, no image).
        Prerequisites: nothing writes to ``staged`` any more; with ``memory``, its memory dir
        holds the three :data:`IMAGE_FILES`.
        On success: every blob is in the store, then ``manifests/<id>.json`` was created; the
        snapshot is indexed, its memory image kept locally for restores, and ``staged`` is gone.
        On failure: :class:`AlreadyExists` if the id is taken (here or by another node);
        :class:`FailedPrecondition` for an incomplete image; :class:`Unavailable` if the store
        failed (after its retries). Nothing is visible; blobs already put wait for GC; the
        staged directory is left for the caller to :meth:`discard`.
        """
        snapshot_id = self._check_new(staged, draft)
        self._committing.add(snapshot_id)
        try:
            async with self._gate.commit():
                snapshot = await self._publish(staged, draft, layers, envd_bundle,
                                               memory, memory_dir, disk)
        finally:
            self._committing.discard(snapshot_id)
        if snapshot.manifest.memory:
            await asyncio.to_thread(self._local.link_image, snapshot.manifest)
        await self.discard(staged)
        log.info("committed snapshot %s to %s", snapshot_id, self.store.describe())
        return snapshot

    async def commit_later(
        self,
        staged: Staged,
        draft: SnapshotDraft,
        *,
        layers: Sequence[Path],
        envd_bundle: Path,
        disk: DiskImage | None = None,
        disk_export: DiskExportOrder | None = None,
    ) -> SnapshotDraft:
        """:meth:`commit`, after the answer (``storage/answered.py``).

        ``disk_export``: instead of ``disk``, a disk clone the commit exports first
        (``storage/disk_exports.py``), after earlier exports of the same sandbox.

        Prerequisites: as :meth:`commit`'s. On success: the order of the commit is written
        beside the staged image (a crash from now on is finished by the next :meth:`start`)
        and the commit runs in the background; :meth:`lookup` and :meth:`settle` wait for it.
        On failure: :class:`AlreadyExists` if the id is taken; :class:`Unavailable` if the
        store does not answer (one request is made first); ``OSError``; nothing is pending and
        the staged directory is left for the caller to :meth:`discard`.
        """
        self._check_new(staged, draft)
        await self._answered.seal(staged, CommitOrder(
            draft=draft, layers=[str(p) for p in layers], envd_bundle=str(envd_bundle),
            disk=disk, disk_export=disk_export))
        return draft

    async def _publish(self, staged: Staged, draft: SnapshotDraft, layers: Sequence[Path],
                       envd_bundle: Path, memory: bool, memory_dir: Path | None,
                       disk: DiskImage | None) -> Snapshot:
        snapshot_id = staged.snapshot_id
        files = (await self._adopt_image(snapshot_id, memory_dir or staged.memory_dir)
                 if memory else [])
        layer_blobs = [await self.artifacts.layer_blob(path) for path in layers]
        bundle = await self.artifacts.bundle_blob(envd_bundle)
        manifest = SnapshotManifest(
            **draft.model_dump(), layers=layer_blobs, memory=files, envd_bundle=bundle,
            disk=disk)
        sources: list[tuple[Blob, Path | None]] = [
            *zip(layer_blobs, layers, strict=True), (bundle, envd_bundle),
            *((f, None) for f in files), *((c, None) for c in (disk.chunks if disk else []))]
        # Blobs a committed manifest names are in the store (GC keeps them), and so are those
        # this process put or saw lately: no request for those now, only the re-check below.
        # A disk snapshot that changed 6 of 1,000 chunks then puts 6, even when the snapshot
        # before it was deleted. The rest go a few at a time: on S3 each request has its
        # round trip.
        named = self.referenced_digests() | self._present
        limit = asyncio.Semaphore(PUT_CONCURRENCY)

        async def put(ref: Blob, source: Path | None) -> bool:
            if ref.digest in named:
                return False
            async with limit:
                return await self._push(ref, source)

        put_done = await asyncio.gather(*(put(ref, source) for ref, source in sources))
        present = [ref for (ref, _), done in zip(sources, put_done, strict=True) if not done]
        fault(f"commit.{draft.kind}.blobs")
        await self.store.put_bytes(
            manifest_key(snapshot_id), manifest.model_dump_json(indent=1).encode(),
            create=True)
        fault(f"commit.{draft.kind}.manifest")
        await self._recheck(present, dict((r.digest, s) for r, s in sources))
        snapshot = Snapshot(manifest)
        self._manifests.add(snapshot)
        return snapshot

    async def _adopt_image(self, snapshot_id: str, memory_dir: Path) -> list[MemoryFile]:
        files = []
        for name in IMAGE_FILES:
            path = memory_dir / name
            if not path.is_file() or path.is_symlink():
                raise FailedPrecondition(
                    f"snapshot {snapshot_id}: memory image incomplete in {memory_dir}, "
                    f"missing {name}")
            ref, _ = await self.cache.adopt(path)
            files.append(MemoryFile(name=name, digest=ref.digest, size=ref.size))  # type: ignore[arg-type]
        return files

    async def _push(self, ref: Blob, exported_from: Path | None) -> bool:
        """Put one blob unless the store has it; True if it was put."""
        blob = BlobRef(ref.digest, ref.size)
        if await self.store.head(blob_key(ref.digest)) is not None:
            self._present.add(ref.digest)
            return False
        if exported_from is not None:
            await self.artifacts.ensure_exported(exported_from, blob)
        await self.store.put_file(blob_key(ref.digest), self.cache.path(ref.digest))
        self._present.add(ref.digest)
        return True

    async def _recheck(self, present: Sequence[Blob], sources: dict[str, Path | None]) -> None:
        """Blobs this commit found already in the store may have been deleted since by a GC
        on another node (they were unreferenced and old): put back any that are gone."""
        by_key = {blob_key(ref.digest): ref for ref in present}
        for key in sorted(await self.store.missing(list(by_key),
                                                   concurrency=CHECK_CONCURRENCY)):
            ref = by_key[key]
            log.warning("blob %s vanished during a commit (a GC elsewhere?): put again",
                        ref.digest)
            self._present.discard(ref.digest)
            await self._push(ref, sources.get(ref.digest))

    def _check_new(self, staged: Staged, draft: SnapshotDraft) -> str:
        """The staged snapshot's id, once it matches ``draft`` and is not committed or being
        committed here (else ``InvalidArgument``, ``AlreadyExists``)."""
        snapshot_id = check_snapshot_id(staged.snapshot_id)
        if draft.snapshot_id != snapshot_id:
            raise InvalidArgument(
                f"manifest names snapshot {draft.snapshot_id!r}, staged is {snapshot_id!r}")
        self._check_staged(staged)
        if snapshot_id in self._manifests or snapshot_id in self._committing:
            raise AlreadyExists(f"snapshot {snapshot_id} already exists")
        return snapshot_id

    def _check_staged(self, staged: Staged) -> None:
        # Never rename or delete a path the caller made up: only direct children of our staging
        # directory named after the id.
        path = staged.path
        if path.parent != self.staging or not path.name.startswith(staged.snapshot_id + "."):
            raise InvalidArgument(f"{path} is not a staging directory of {self.staging}")

    async def discard(self, staged: Staged) -> None:
        """Remove a staging directory (idempotent; after a commit it is already gone)."""
        check_snapshot_id(staged.snapshot_id)
        self._check_staged(staged)
        await asyncio.to_thread(rmtree, staged.path)

    async def delete(self, snapshot_id: str) -> None:
        """Delete snapshot ``snapshot_id``: its manifest goes (atomically), its blobs with GC.

        Prerequisites: no sandbox is being started from it right now (the caller serializes).
        On failure: :class:`NotFound` if there is no such snapshot; :class:`Unavailable`.
        """
        snapshot = await self.lookup(snapshot_id)
        if snapshot is None or snapshot.snapshot_id != snapshot_id:
            raise NotFound(f"snapshot {snapshot_id} not found")
        await self.store.delete(manifest_key(snapshot_id))
        self._manifests.discard(snapshot_id)
        await asyncio.to_thread(rmtree, self.images / snapshot_id)
        log.info("deleted snapshot %s", snapshot_id)

    # -- reading (the index: ``storage/manifest_index.py``) -----------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        await self._manifests.refresh(force=force)

    def get(self, snapshot_id: str) -> Snapshot | None:
        return self._manifests.get(snapshot_id)

    async def committed(self, snapshot_id: str) -> bool:
        return await self._manifests.committed(snapshot_id)

    def find(self, name_or_id: str) -> Snapshot | None:
        return self._manifests.find(name_or_id)

    def list(self, *, sandbox_id: str | None = None, name: str | None = None,
             kind: str | None = "snapshot") -> builtins.list[Snapshot]:
        return self._manifests.list(sandbox_id=sandbox_id, name=name, kind=kind)

    def referenced_digests(self) -> set[str]:
        return self._manifests.referenced_digests()

    async def lookup(self, name_or_id: str, *, verify: bool = False) -> Snapshot | None:
        """:meth:`find`, refreshing the index from the store first if it does not know it.

        ``verify``: also make sure the one found is still committed (another node may have
        deleted it since the index was read: one HEAD request), refreshing if it is not.
        """
        await self._answered.settle(name_or_id)
        found = self.find(name_or_id)
        if found is not None and verify and not await self.committed(found.snapshot_id):
            found = None
        if found is None and is_snapshot_id(name_or_id):
            # An id another node committed since the index was read: one request for it,
            # then (for names) a listing at most every REFRESH_S.
            direct = await self._manifests.load(name_or_id)
            if direct is not None:
                self._manifests.add(direct)
                return direct
            await self.refresh()
            found = self.find(name_or_id)
        return found

    async def require(self, snapshot_id: str) -> Snapshot:
        snapshot = await self.lookup(snapshot_id)
        if snapshot is None or snapshot.snapshot_id != snapshot_id:
            raise NotFound(f"snapshot {snapshot_id} not found")
        return snapshot

    # -- answered, still being committed (``storage/answered.py``) ----------------------------

    async def settle(self, name_or_id: str | None = None) -> None:
        await self._answered.settle(name_or_id)

    def pending(self, snapshot_id: str) -> bool:
        return self._answered.pending(snapshot_id)

    def pending_clones(self) -> set[str]:
        return self._answered.pending_clones()

    def pending_draft(self, name_or_id: str) -> SnapshotDraft | None:
        return self._answered.pending_draft(name_or_id)

    async def materialize_pending(
        self, name_or_id: str, disk_dir: Path | None
    ) -> tuple[SnapshotDraft, Materialized] | None:
        return await self._answered.materialize_pending(name_or_id, disk_dir)

    # -- garbage collection -------------------------------------------------------------------

    async def collect_garbage(self, *, grace_s: float = DEFAULT_GRACE_S) -> CollectionPlan:
        """Delete the blobs no committed manifest names (``storage/gc.py`` has the rules),
        and this node's local images of snapshots that are gone.

        Safe while creates, pauses, snapshots and builds run: commits on this node wait for
        the pass (and it for them); other nodes' commits are covered by ``grace_s``.
        On failure: :class:`Unavailable`; what was deleted stays deleted (unreferenced).
        """
        async with self._gate.collect():
            await self.refresh(force=True)
            blobs = await self.store.list(BLOB_LIST_PREFIX)
            now = datetime.datetime.now(datetime.UTC)
            plan = plan_collection(blobs, self.referenced_digests(), now=now, grace_s=grace_s)
            fault("gc.planned")
            self._present.clear()  # what was present may be deleted now
            for key in plan.delete:
                await self.store.delete(key)
                fault("gc.deleted")
        for name in listdir(self.images):
            # A pending snapshot's image is linked here before its manifest exists.
            if not name.startswith(".") and name not in self._manifests \
                    and not self._answered.pending(name):
                await asyncio.to_thread(rmtree, self.images / name)
        log.info("gc: deleted %d blobs (%.1f MB), kept %d referenced and %d recent",
                 len(plan.delete), plan.freed_bytes / 1e6, plan.kept_referenced,
                 plan.kept_young)
        return plan

    async def trim_cache(self) -> Sequence[str]:
        """Drop least recently used cached blobs beyond the cache's budget; returns their
        digests. Runs alone, as a GC pass does: a commit between adopting its blobs into the
        cache and putting them from there must not lose one (it did: a snapshot answered 500
        "FileNotFoundError" in the long torture)."""
        async with self._gate.collect():
            return await asyncio.to_thread(self.cache.trim)

    # -- making a snapshot usable here --------------------------------------------------------

    async def materialize(self, snapshot: Snapshot, own_bundle: Path,
                          disk_dir: Path | None = None) -> Materialized:
        """Everything a restore of ``snapshot`` needs, on this node's disk
        (``storage/materialize.py``)."""
        return await self._local.materialize(snapshot.manifest, own_bundle, disk_dir)
