"""The index of committed snapshots: every manifest under ``manifests/`` in the object store,
parsed and cached in memory (:class:`ManifestIndex`), so listings and lookups by id or name
make no request.

Other nodes commit and delete behind this node's back, so the index is only as fresh as its
last read. :class:`~aenv.storage.repository.SnapshotRepository` owns one and keeps it current:
it refreshes it at start and before a GC pass (forced), when asked for something it does not
know (at most every :data:`REFRESH_S`), reads one manifest directly for an id it lacks, and
adds or drops the snapshots it commits and deletes itself. Manifests that do not parse, name
another snapshot or have a newer format are skipped (logged), never deleted.
"""

from __future__ import annotations

import builtins
import logging
import time
from dataclasses import dataclass

from pydantic import ValidationError

from aenv.core.errors import NotFound
from aenv.storage.manifest import (
    MANIFEST_FORMAT,
    SnapshotManifest,
    check_snapshot_id,
    is_snapshot_id,
)
from aenv.storage.objects import ObjectStore

__all__ = ["MANIFEST_PREFIX", "REFRESH_S", "ManifestIndex", "Snapshot", "manifest_key"]

log = logging.getLogger("aenv.storage.manifest_index")

MANIFEST_PREFIX = "manifests/"
#: How stale a listing may be (other nodes commit and delete behind our back).
REFRESH_S = 1.0


def manifest_key(snapshot_id: str) -> str:
    return f"{MANIFEST_PREFIX}{check_snapshot_id(snapshot_id)}.json"


@dataclass(frozen=True)
class Snapshot:
    """A committed snapshot: its manifest."""

    manifest: SnapshotManifest

    @property
    def snapshot_id(self) -> str:
        return self.manifest.snapshot_id


class ManifestIndex:
    """The committed snapshots of one store, by id, as last read from it."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._index: dict[str, Snapshot] = {}
        self._refreshed = 0.0

    async def refresh(self, *, force: bool = False) -> None:
        """Re-read the manifests of the store (at most every :data:`REFRESH_S` unless forced)."""
        if not force and time.monotonic() - self._refreshed < REFRESH_S:
            return
        listed = await self.store.list(MANIFEST_PREFIX)
        keys = {info.key for info in listed}
        index: dict[str, Snapshot] = {}
        for key in sorted(keys):
            name = key.removeprefix(MANIFEST_PREFIX).removesuffix(".json")
            known = self._index.get(name)
            if known is not None:
                index[name] = known
                continue
            snapshot = await self._load(key, name)
            if snapshot is not None:
                index[name] = snapshot
        self._index = index
        self._refreshed = time.monotonic()

    async def load(self, snapshot_id: str) -> Snapshot | None:
        """Read the manifest of ``snapshot_id`` from the store (one request, not indexed);
        ``None`` if there is none or it is skipped. ``InvalidArgument`` for a malformed id."""
        return await self._load(manifest_key(snapshot_id), snapshot_id)

    async def _load(self, key: str, name: str) -> Snapshot | None:
        if not key.endswith(".json") or not is_snapshot_id(name):
            return None
        try:
            raw = await self.store.get_bytes(key)
        except NotFound:
            return None  # deleted between the listing and the read
        try:
            manifest = SnapshotManifest.model_validate_json(raw)
        except ValidationError as exc:
            log.error("skipping manifest %s: %s", key, str(exc).splitlines()[0])
            return None
        if manifest.snapshot_id != name:
            log.error("skipping manifest %s: it names snapshot %r", key, manifest.snapshot_id)
            return None
        if manifest.format > MANIFEST_FORMAT:
            log.error("skipping manifest %s: format %d is newer", key, manifest.format)
            return None
        return Snapshot(manifest)

    def add(self, snapshot: Snapshot) -> None:
        """Index ``snapshot``, whose manifest is in the store (committed or read here)."""
        self._index[snapshot.snapshot_id] = snapshot

    def discard(self, snapshot_id: str) -> None:
        """Forget ``snapshot_id`` (its manifest is gone from the store; idempotent)."""
        self._index.pop(snapshot_id, None)

    def __contains__(self, snapshot_id: object) -> bool:
        """Whether ``snapshot_id`` is indexed (any string: no id check)."""
        return snapshot_id in self._index

    def get(self, snapshot_id: str) -> Snapshot | None:
        """The indexed snapshot ``snapshot_id``, or ``None`` (also for a malformed id)."""
        if not is_snapshot_id(snapshot_id):
            return None
        return self._index.get(snapshot_id)

    async def committed(self, snapshot_id: str) -> bool:
        """Whether the store holds the manifest of ``snapshot_id`` now (one request, no
        listing: the index may be stale)."""
        found = await self.store.head(manifest_key(snapshot_id)) is not None
        if not found:
            self._index.pop(snapshot_id, None)
        return found

    def find(self, name_or_id: str) -> Snapshot | None:
        """The snapshot with id ``name_or_id``, else the newest one (of any kind) with that name.

        An id wins over a name, so naming a snapshot after another's id cannot hide that one.
        """
        by_id = self.get(name_or_id)
        if by_id is not None:
            return by_id
        named = self.list(name=name_or_id, kind=None)
        return named[0] if named else None

    def list(
        self,
        *,
        sandbox_id: str | None = None,
        name: str | None = None,
        kind: str | None = "snapshot",
    ) -> builtins.list[Snapshot]:
        """Indexed snapshots, newest first (``created_at`` descending, then id descending)."""
        found = [
            s
            for s in self._index.values()
            if (sandbox_id is None or s.manifest.source_sandbox_id == sandbox_id)
            and (name is None or name in s.manifest.names)
            and (kind is None or s.manifest.kind == kind)
        ]
        found.sort(key=lambda s: (s.manifest.created_at, s.snapshot_id), reverse=True)
        return found

    def referenced_digests(self) -> set[str]:
        """Every blob an indexed manifest names."""
        found: set[str] = set()
        for snapshot in self._index.values():
            found |= snapshot.manifest.digests()
        return found
