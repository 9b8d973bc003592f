"""A committed snapshot made usable on this node: what a restore reads, fetched and checked.

Owns ``<home>/cache/images/`` (a snapshot's memory image as hard links of its cached blobs,
the directory ``runsc restore`` reads) and the disk images it assembles in the directory its
caller names (on the workspace pool). Layers go to the layer store and envd bundles to
``artifacts.py``; blobs come through the node's blob cache, each checked against its digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import FailedPrecondition
from aenv.storage.artifacts import Artifacts
from aenv.storage.blobs import BlobRef
from aenv.storage.disk_chunks import assemble_disk
from aenv.storage.files import fsync_dirs, rmtree
from aenv.storage.manifest import IMAGE_FILES, SnapshotManifest
from aenv.storage.objects import ObjectStore


@dataclass(frozen=True)
class Materialized:
    """What a node needs locally to start a sandbox from a snapshot."""

    #: The runsc memory image directory; ``None`` for a filesystem-only snapshot.
    image: Path | None
    #: Layer directories, lowest first.
    layers: tuple[Path, ...]
    envd_bundle: Path
    #: Disk workspaces: the snapshot's disk image on this node's pool (None: files in memory).
    disk: Path | None = None


class LocalCopies:
    def __init__(self, store: ObjectStore, artifacts: Artifacts, images: Path) -> None:
        self.store = store
        self.artifacts = artifacts
        self.cache = artifacts.cache
        #: ``<home>/cache/images``.
        self.images = images
        self._locks: dict[str, asyncio.Lock] = {}
        self._linking = threading.Lock()

    async def materialize(self, manifest: SnapshotManifest, own_bundle: Path,
                          disk_dir: Path | None) -> Materialized:
        """Everything a restore of the snapshot ``manifest`` needs, on this node's disk.

        Fetches what is missing (memory-image files into the blob cache, layers into the layer
        store, the envd bundle if it is not this node's, the disk image's chunks), each checked
        against its digest.
        On failure: :class:`NotFound` if a blob is gone from the store; :class:`DataLoss` for a
        corrupt one; :class:`Unavailable` when the store is unreachable;
        :class:`FailedPrecondition` for a disk snapshot on a node without disk workspaces.
        """
        layers = tuple([await self.artifacts.ensure_layer(self.store, ref)
                        for ref in manifest.layers])
        bundle = await self.artifacts.ensure_bundle(self.store, manifest.envd_bundle, own_bundle)
        disk = await self._disk(manifest, disk_dir) if manifest.disk is not None else None
        if not manifest.memory:
            return Materialized(None, layers, bundle, disk)
        async with self._locks.setdefault(manifest.snapshot_id, asyncio.Lock()):
            image = self.images / manifest.snapshot_id
            if not _image_complete(image):
                for ref in manifest.memory:
                    await self.cache.fetch(self.store, BlobRef(ref.digest, ref.size))
                await asyncio.to_thread(self.link_image, manifest)
        return Materialized(image, layers, bundle, disk)

    async def _disk(self, manifest: SnapshotManifest, disk_dir: Path | None) -> Path:
        """The snapshot's disk image as a file in ``disk_dir`` (on the workspace pool),
        assembled from its chunks unless this node already has it."""
        disk = manifest.disk
        assert disk is not None
        if disk_dir is None:
            raise FailedPrecondition(
                f"snapshot {manifest.snapshot_id} holds a disk workspace; this node keeps "
                "written files in memory (workspace=memory)")
        final = disk_dir / f"{manifest.snapshot_id}.img"
        if final.is_file():
            return final
        async with self._locks.setdefault(f"disk-{manifest.snapshot_id}", asyncio.Lock()):
            if not final.is_file():
                parts = [(c.index, await self.cache.fetch(self.store, BlobRef(c.digest, c.size)))
                         for c in disk.chunks]
                disk_dir.mkdir(parents=True, exist_ok=True)
                await asyncio.to_thread(assemble_disk, final, disk.size, parts)
        return final

    def link_image(self, manifest: SnapshotManifest) -> None:
        """``<images>/<id>/`` as hard links of the cached memory-image blobs (blocking)."""
        self._link(manifest.snapshot_id,
                   {ref.name: self.cache.path(ref.digest) for ref in manifest.memory})

    def link_staged(self, snapshot_id: str, memory_dir: Path) -> Path:
        """``<images>/<id>/`` as hard links of a staged memory image (a snapshot answered
        and not committed yet: its commit adopts these very files, so the image stays as it
        is); returns it (blocking). ``FileNotFoundError`` if the staged files are gone."""
        self._link(snapshot_id, {name: memory_dir / name for name in IMAGE_FILES})
        return self.images / snapshot_id

    def _link(self, snapshot_id: str, sources: dict[str, Path]) -> None:
        final = self.images / snapshot_id
        # One at a time: a create from a pending snapshot and its commit may both link it,
        # and one must not remove what the other just put in place for a restore.
        with self._linking:
            if _image_complete(final):
                return
            building = self.images / f".{snapshot_id}.{secrets.token_hex(4)}"
            building.mkdir(0o700, parents=True)
            try:
                for name, source in sources.items():
                    os.link(source, building / name)
                with contextlib.suppress(FileNotFoundError):
                    rmtree(final)
                building.rename(final)
                fsync_dirs(self.images)
            except BaseException:
                rmtree(building)
                raise


def _image_complete(image: Path) -> bool:
    return all((image / name).is_file() for name in IMAGE_FILES)
