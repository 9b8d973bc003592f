"""Volumes in the repository: what exists, under which name, its committed data, and which node
holds it — so every node sharing the repository sees the same volumes.

Owns, in the object store (``storage/objects.py``)::

    volumes/<volume_id>.json          the volume (:class:`VolumeManifest`): name, size, and
                                      the chunks of its last committed image
    volume-names/[<team id>/]<name>   the name's claim (its volume id), created conditionally:
                                      two nodes creating one name cannot both win
    volume-holders/<volume_id>        the node that has the volume checked out (it alone
                                      mounts and writes it), created conditionally
    volume-chunks/<volume_id>/<hex>   the image's 4 MiB chunks by sha256 (holes are absent)

Chunks live outside ``blobs/``: the snapshot GC never sees them; a volume's own commit drops
the chunks its previous version named and this one does not, and delete drops them all.

Commit protocol: chunks first, the manifest last (it names only chunks already put), so a
crash leaves the previous version whole. A holder whose node died stays until that node
starts again (it takes its own holds back) or an operator deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aenv.core.errors import AlreadyExists, Conflict, DataLoss, NotFound
from aenv.storage.disk_chunks import CHUNK_BYTES, signatures
from aenv.storage.manifest import DiskChunk
from aenv.storage.objects import ObjectStore

MANIFESTS = "volumes/"
NAMES = "volume-names/"
HOLDERS = "volume-holders/"
CHUNKS = "volume-chunks/"
PUT_CONCURRENCY = 4


class VolumeManifest(BaseModel):
    model_config = ConfigDict(frozen=True)
    volume_id: str
    name: str
    size_bytes: int
    created_at: float
    #: Bumped by each commit; 0: never committed (a blank image of ``size_bytes``).
    version: int = 0
    #: Digests checked by their pattern: a chunk's key is made from its digest.
    chunks: list[DiskChunk] = Field(default_factory=list)
    #: The team that owns it (None: made before teams, the default team's).
    team_id: str | None = None


class VolumeCatalog:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    # -- the volumes ----------------------------------------------------------------------------
    # A name is a team's: each team's claims are under a prefix of its own (the default
    # team's, None, where every claim was before teams).

    async def create(self, volume_id: str, name: str, size_bytes: int,
                     team_id: str | None = None) -> VolumeManifest:
        """Claim ``name`` for ``team_id`` and record the volume; ``AlreadyExists`` if the team
        has a volume of that name."""
        try:
            await self.store.put_bytes(_claim(name, team_id), volume_id.encode(), create=True)
        except AlreadyExists:
            raise AlreadyExists(f"Volume with name '{name}' already exists") from None
        manifest = VolumeManifest(volume_id=volume_id, name=name, size_bytes=size_bytes,
                                  created_at=time.time(), team_id=team_id)
        try:
            await self._write(manifest)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.delete(_claim(name, team_id)))
            raise
        return manifest

    async def get(self, volume_id: str) -> VolumeManifest | None:
        try:
            raw = await self.store.get_bytes(MANIFESTS + f"{volume_id}.json")
        except NotFound:
            return None
        try:
            return VolumeManifest.model_validate_json(raw)
        except ValidationError as exc:
            raise DataLoss(f"the manifest of volume {volume_id} is unreadable") from exc

    async def require(self, volume_id: str) -> VolumeManifest:
        found = await self.get(volume_id)
        if found is None:
            raise NotFound(f"Volume {volume_id} not found")
        return found

    async def by_name(self, name: str, team_id: str | None = None) -> VolumeManifest | None:
        """``team_id``'s volume called ``name`` (None: the default team's)."""
        try:
            volume_id = (await self.store.get_bytes(_claim(name, team_id))).decode()
        except NotFound:
            return None
        manifest = await self.get(volume_id)
        return (manifest if manifest is not None and manifest.name == name
                and manifest.team_id == team_id else None)

    async def list(self) -> list[VolumeManifest]:
        found = []
        for info in await self.store.list(MANIFESTS):
            if info.key.endswith(".json"):
                manifest = await self.get(info.key.removeprefix(MANIFESTS).removesuffix(".json"))
                if manifest is not None:
                    found.append(manifest)
        found.sort(key=lambda m: (m.created_at, m.volume_id))
        return found

    async def delete(self, manifest: VolumeManifest) -> None:
        """The manifest first (the volume is gone from then on), then its name and chunks."""
        await self.store.delete(MANIFESTS + f"{manifest.volume_id}.json")
        await self.store.delete(_claim(manifest.name, manifest.team_id))
        await self.store.delete(HOLDERS + manifest.volume_id)
        for info in await self.store.list(CHUNKS + manifest.volume_id + "/"):
            await self.store.delete(info.key)

    # -- who holds it -----------------------------------------------------------------------------

    async def holder(self, volume_id: str) -> str | None:
        try:
            return (await self.store.get_bytes(HOLDERS + volume_id)).decode()
        except NotFound:
            return None

    async def hold(self, volume_id: str, node_id: str) -> None:
        """Take the volume for ``node_id`` (idempotent for the same node); ``Conflict`` while
        another node holds it."""
        try:
            await self.store.put_bytes(HOLDERS + volume_id, node_id.encode(), create=True)
        except AlreadyExists:
            current = await self.holder(volume_id)
            if current != node_id:
                raise Conflict(f"volume {volume_id} is in use on node {current}; it is "
                               "released when its sandboxes there end") from None

    async def release(self, volume_id: str, node_id: str) -> None:
        if await self.holder(volume_id) == node_id:
            await self.store.delete(HOLDERS + volume_id)

    # -- data -------------------------------------------------------------------------------------

    async def commit(self, manifest: VolumeManifest, image: Path) -> VolumeManifest:
        """Put the chunks of ``image`` (quiesced: unmounted or synced) the store lacks, then the
        manifest naming them; the chunks only the previous version named are dropped."""
        indexes = sorted(await asyncio.to_thread(signatures, image))
        limit = asyncio.Semaphore(PUT_CONCURRENCY)
        prefix = CHUNKS + manifest.volume_id + "/"

        async def put(index: int) -> DiskChunk:
            async with limit:
                data = await asyncio.to_thread(_read_chunk, image, index)
                digest = "sha256:" + hashlib.sha256(data).hexdigest()
                if await self.store.head(_chunk_key(prefix, digest)) is None:
                    await self.store.put_bytes(_chunk_key(prefix, digest), data)
                return DiskChunk(index=index, digest=digest, size=len(data))

        chunks = list(await asyncio.gather(*(put(i) for i in indexes)))
        committed = manifest.model_copy(update={"version": manifest.version + 1,
                                                "chunks": chunks})
        await self._write(committed)
        kept = {c.digest for c in chunks}
        for old in {c.digest for c in manifest.chunks} - kept:
            with contextlib.suppress(Exception):
                await self.store.delete(_chunk_key(prefix, old))
        return committed

    async def fetch(self, manifest: VolumeManifest, dest: Path) -> None:
        """Write the committed image to ``dest`` (a new file; holes where no chunk is)."""
        prefix = CHUNKS + manifest.volume_id + "/"
        fd = await asyncio.to_thread(os.open, dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            await asyncio.to_thread(os.ftruncate, fd, manifest.size_bytes)
            for chunk in manifest.chunks:
                data = await self.store.get_bytes(_chunk_key(prefix, chunk.digest))
                if "sha256:" + hashlib.sha256(data).hexdigest() != chunk.digest:
                    raise DataLoss(f"a chunk of volume {manifest.volume_id} does not match "
                                   "its digest")
                await asyncio.to_thread(os.pwrite, fd, data, chunk.index * CHUNK_BYTES)
            await asyncio.to_thread(os.fsync, fd)
        finally:
            os.close(fd)

    async def _write(self, manifest: VolumeManifest) -> None:
        await self.store.put_bytes(MANIFESTS + f"{manifest.volume_id}.json",
                                   manifest.model_dump_json().encode())


def _chunk_key(prefix: str, digest: str) -> str:
    return prefix + digest.removeprefix("sha256:")


def _read_chunk(image: Path, index: int) -> bytes:
    with open(image, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        return os.pread(f.fileno(), min(CHUNK_BYTES, size - index * CHUNK_BYTES),
                        index * CHUNK_BYTES)


def _claim(name: str, team_id: str | None) -> str:
    """The key of a team's claim on ``name`` (names hold no ``/``: ``volumes.NAME``)."""
    return NAMES + (name if team_id is None else f"{team_id}/{name}")
