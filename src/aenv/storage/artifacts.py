"""Layers and envd bundles as repository blobs: exported once, imported on demand.

Owns ``<home>/cache/exports/`` and ``<home>/cache/bundles/`` and nothing else::

    <home>/cache/exports/<key>.json     which blob a local directory exported to: {digest, size}
                                        (key: a layer id, or ``bundle-<dir name>``)
    <home>/cache/bundles/<hex>/         an envd bundle imported from the repository (read-only)
    <home>/cache/bundles/.staging/      an import in progress (swept at start)

A directory is exported as a deterministic OCI layer tar (``layer_tar.py``) into the blob cache,
so one tree has one digest on every node. Layers and bundles never change once they have an id
(layer ids are recipe or content digests; bundle directories are per input hash), so the export
record is kept and the tar is made again only if the blob has left both the cache and the
repository. An imported layer goes into the layer store under its id, through the same
unpacker as OCI images (nothing in a blob can reach outside its destination).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from pathlib import Path

from aenv.core.errors import FailedPrecondition
from aenv.storage.blobs import BlobCache, BlobRef
from aenv.storage.files import listdir, rmtree
from aenv.storage.layer_tar import export_tree
from aenv.storage.layers import LayerStore, check_layer_id
from aenv.storage.manifest import Blob, LayerBlob
from aenv.storage.objects import ObjectStore
from aenv.storage.unpack import UnpackLimits, unpack_layer

log = logging.getLogger("aenv.storage.artifacts")

#: An imported layer or bundle may be as large as the layer store allows; the repository is
#: trusted less than the node but more than a registry, so only a sanity cap applies.
MAX_IMPORT_BYTES = 200 << 30


class Artifacts:
    def __init__(self, root: Path, layers: LayerStore, cache: BlobCache) -> None:
        #: ``<home>/cache``.
        self.root = Path(root)
        self.layers = layers
        self.cache = cache
        self._exports = self.root / "exports"
        self._bundles = self.root / "bundles"
        self._locks: dict[str, asyncio.Lock] = {}

    def start(self) -> None:
        self._exports.mkdir(parents=True, exist_ok=True)
        staging = self._bundles / ".staging"
        staging.mkdir(parents=True, exist_ok=True)
        for name in listdir(staging):
            rmtree(staging / name)

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # -- export -------------------------------------------------------------------------------

    async def layer_blob(self, layer_path: Path) -> LayerBlob:
        """The blob of the layer at ``layer_path`` (a directory of the layer store)."""
        layer_id = check_layer_id(Path(layer_path).name)
        ref = await self._export(layer_id, Path(layer_path))
        return LayerBlob(digest=ref.digest, size=ref.size, layer_id=layer_id)

    async def bundle_blob(self, bundle: Path) -> Blob:
        """The blob of the envd bundle directory ``bundle``."""
        ref = await self._export(f"bundle-{Path(bundle).name}", Path(bundle))
        return Blob(digest=ref.digest, size=ref.size)

    async def ensure_exported(self, key_path: Path, ref: BlobRef) -> None:
        """Make the cached blob of an exported directory exist again (it was trimmed)."""
        if not self.cache.has(ref.digest):
            made = await self._tar(key_path)
            if made.digest != ref.digest:
                raise FailedPrecondition(
                    f"{key_path} changed since it was exported ({ref.digest} → {made.digest})")

    async def _export(self, key: str, tree: Path) -> BlobRef:
        record = self._exports / f"{key}.json"
        async with self._lock(key):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                data = json.loads(record.read_text())
                return BlobRef(str(data["digest"]), int(data["size"]))
            if not tree.is_dir():
                raise FailedPrecondition(f"cannot export {tree}: not a directory")
            ref = await self._tar(tree)
            temporary = record.with_name(f".{record.name}.{secrets.token_hex(4)}")
            temporary.write_text(json.dumps({"digest": ref.digest, "size": ref.size}))
            temporary.replace(record)
            log.info("exported %s as blob %s (%d bytes)", tree, ref.digest, ref.size)
            return ref

    async def _tar(self, tree: Path) -> BlobRef:
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = self.root / f".export-{secrets.token_hex(6)}.tar"
        try:
            def work() -> None:
                with open(scratch, "wb") as out:
                    export_tree(tree, out)
                    os.fsync(out.fileno())
            await asyncio.to_thread(work)
            ref, _ = await self.cache.adopt(scratch)
        finally:
            with contextlib.suppress(FileNotFoundError):
                scratch.unlink()
        return ref

    # -- import -------------------------------------------------------------------------------

    async def ensure_layer(self, store: ObjectStore, ref: LayerBlob) -> Path:
        """The local path of layer ``ref``, imported from the repository if missing here."""
        if self.layers.has(ref.layer_id):
            self.layers.touch(ref.layer_id)
            return self.layers.path(ref.layer_id)
        async with self._lock(ref.layer_id):
            if self.layers.has(ref.layer_id):
                return self.layers.path(ref.layer_id)
            blob = await self.cache.fetch(store, BlobRef(ref.digest, ref.size))
            async with self.layers.staging(ref.layer_id) as staging:
                await asyncio.to_thread(_unpack, blob, staging)
                layer = await self.layers.put_from_dir(staging, ref.layer_id, recipe={
                    "kind": "repository-layer", "digest": ref.digest})
            self._remember(ref.layer_id, BlobRef(ref.digest, ref.size))
            log.info("imported layer %s from %s", ref.layer_id[:12], store.describe())
            return layer.path

    async def ensure_bundle(self, store: ObjectStore, ref: Blob, own: Path) -> Path:
        """An envd bundle directory whose blob is ``ref``: the node's own if it matches."""
        if (await self.bundle_blob(own)).digest == ref.digest:
            return own
        final = self._bundles / ref.digest.removeprefix("sha256:")
        if final.is_dir():
            return final
        async with self._lock(ref.digest):
            if final.is_dir():
                return final
            blob = await self.cache.fetch(store, BlobRef(ref.digest, ref.size))
            staging = self._bundles / ".staging" / secrets.token_hex(6)
            staging.mkdir(parents=True)
            try:
                await asyncio.to_thread(_unpack, blob, staging)
                staging.rename(final)
            except BaseException:
                await asyncio.to_thread(rmtree, staging)
                raise
            log.info("imported envd bundle %s from %s", ref.digest[:19], store.describe())
            return final

    def _remember(self, key: str, ref: BlobRef) -> None:
        # The imported tree exports to the same blob (the tar is deterministic): recording it
        # saves a re-export when this node snapshots a sandbox on that layer.
        record = self._exports / f"{key}.json"
        if not record.exists():
            record.write_text(json.dumps({"digest": ref.digest, "size": ref.size}))


def _unpack(blob: Path, dest: Path) -> None:
    with open(blob, "rb") as fh:
        unpack_layer(fh, dest, limits=UnpackLimits(max_bytes=MAX_IMPORT_BYTES))
