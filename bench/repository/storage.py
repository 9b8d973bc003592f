"""Part 1: commit and fetch throughput of the snapshot repository, both backends, next to a
plain ``obstore`` put / get of the same bytes to the same store.

No node server: two "nodes" are :class:`SnapshotRepository` objects with their own staging,
blob cache, image and layer directories (as in ``tests/storage/test_repository.py``), on
``posix_fs`` (a directory on the same filesystem as the caches, so a commit hard-links) or on
S3 (the moto server, a prefix of its own). A staged snapshot is a memory image of random bytes
(``checkpoint.img`` 1/16 of the total, ``pages_meta.img`` 64 KiB, ``pages.img`` the rest), one
small layer and a small envd bundle; the layer and bundle are exported once (warm-up) and only
looked up after that, as on a node.

- commit: ``stage`` + the image files linked in (untimed), then ``commit()`` timed. Bare: the
  same three files put with ``obstore.put`` (same part size and concurrency as the repository)
  under other keys; for posix also a plain copy with fsync, and the sha256 of the bytes (a commit
  hashes every file: its floor on posix).
- fetch: a fresh second node (nothing cached) looks the snapshot up (untimed), then
  ``materialize()`` timed (memory files, the layer unpacked, digests checked, fsync). Bare:
  ``obstore.get`` of the same bytes streamed to a file + fsync; for posix a plain copy too.

Rounds are interleaved (posix, S3) per size; round 0 is a warm-up. Everything a round wrote is
deleted after it, so the store and moto's memory stay small.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import obstore
from obstore.store import LocalStore, S3Store
from tests.s3 import S3Server

from aenv.storage.artifacts import Artifacts
from aenv.storage.blobs import BlobCache, blob_key, hash_file
from aenv.storage.layers import LayerStore, layer_id_for
from aenv.storage.objects import CHUNK_BYTES, Location, ObjectStore, PosixLocation
from aenv.storage.repository import IMAGE_FILES, SnapshotDraft, SnapshotRepository
from bench.lifecycle_bench import Report, log
from bench.node_bench.common import ms_since
from bench.repository.common import BACKENDS, MIB, SizedRow

SIZES_MIB = (16, 64, 256)
LAYER_ID = layer_id_for({"bench": "repository-layer"})


@dataclass
class StoreNode:
    home: Path
    repo: SnapshotRepository
    layer: Path
    bundle: Path


def make_bundle(path: Path) -> Path:
    """A stand-in envd bundle, the same tree on every node (mtimes set)."""
    (path / "lib").mkdir(parents=True)
    (path / "envd").write_bytes(b"#!/bin/sh\n" * 100)
    (path / "lib" / "data").write_bytes(bytes(range(256)) * 256)
    for rel in ("envd", "lib/data", "lib", "."):
        os.utime(path / rel, (1_700_000_000, 1_700_000_000))
    return path


async def new_node(home: Path, location: Location, *, with_layer: bool) -> StoreNode:
    layers = LayerStore(home / "layers")
    cache = BlobCache(home / "cache" / "blobs")
    repo = SnapshotRepository(
        ObjectStore(location), Artifacts(home / "cache", layers, cache),
        home / "staging", home / "cache" / "images",
    )  # fmt: skip
    await repo.start()
    if with_layer:
        async with layers.staging(LAYER_ID) as staging:
            (staging / "etc").mkdir()
            (staging / "etc" / "hostname").write_text("bench\n")
            (staging / "bin").mkdir()
            (staging / "bin" / "tool").write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
            await layers.put_from_dir(staging, LAYER_ID)
    return StoreNode(home, repo, layers.path(LAYER_ID), make_bundle(home / "envd-bundle"))


def write_image(directory: Path, total: int) -> dict[str, Path]:
    """Three files of random bytes, ``total`` bytes together."""
    directory.mkdir(parents=True)
    rng = random.Random(secrets.randbits(64))
    sizes = {"checkpoint.img": total // 16, "pages_meta.img": 64 << 10}
    sizes["pages.img"] = total - sum(sizes.values())
    paths = {}
    for name in IMAGE_FILES:
        paths[name] = directory / name
        with open(paths[name], "wb") as out:
            left = sizes[name]
            while left:
                out.write(rng.randbytes(min(left, 8 * MIB)))
                left -= min(left, 8 * MIB)
    return paths


def bare_store(location: Location, scratch: Path) -> Any:
    """A plain obstore store on the same backend (another prefix or directory)."""
    if isinstance(location, PosixLocation):
        root = scratch / "bare-store"
        root.mkdir(exist_ok=True)
        return LocalStore(root)
    config: Any = {"endpoint": location.endpoint, "region": location.region,
                   "access_key_id": location.access_key_id,
                   "secret_access_key": location.secret_access_key}  # fmt: skip
    return S3Store(location.bucket, prefix=f"{location.prefix}-bare", config=config,
                   client_options={"allow_http": location.allow_http})  # fmt: skip


def copy_synced(source: Path, dest: Path) -> None:
    shutil.copyfile(source, dest)
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def bare_get(store: Any, key: str, dest: Path) -> None:
    result = await obstore.get_async(store, key)
    with open(dest, "wb") as out:
        async for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
            await asyncio.to_thread(out.write, chunk)
        await asyncio.to_thread(os.fsync, out.fileno())


async def one_round(
    backend: str,
    a: StoreNode,
    location: Location,
    bare: Any,
    scratch: Path,
    mib: int,
    warm: bool,
    report: Report,
) -> None:
    """One commit + fetch of a fresh ``mib`` MiB image, and their bare equivalents."""
    sid = f"bench-{secrets.token_hex(6)}"
    work = scratch / sid
    files = write_image(work / "image", mib * MIB)
    samples: dict[str, float] = {}
    staged = a.repo.stage(sid)
    staged.memory_dir.mkdir()
    for name, path in files.items():
        os.link(path, staged.memory_dir / name)
    draft = SnapshotDraft(
        snapshot_id=sid, template_id="base", created_at=time.time(), cpu_count=2, memory_mb=1024
    )
    start = time.perf_counter()
    snapshot = await a.repo.commit(staged, draft, layers=[a.layer], envd_bundle=a.bundle)
    samples["commit"] = ms_since(start)
    start = time.perf_counter()
    for name, path in files.items():
        await obstore.put_async(
            bare, f"{sid}/{name}", path, chunk_size=CHUNK_BYTES, max_concurrency=4
        )
    samples["bare_put"] = ms_since(start)
    if backend == "posix_fs":
        (work / "copy").mkdir()
        start = time.perf_counter()
        for name, path in files.items():
            await asyncio.to_thread(copy_synced, path, work / "copy" / name)
        samples["bare_copy"] = ms_since(start)
        start = time.perf_counter()
        for path in files.values():
            await asyncio.to_thread(hash_file, path)
        samples["sha256"] = ms_since(start)
    b = await new_node(work / "b", location, with_layer=False)
    found = await b.repo.lookup(sid)
    assert found is not None, f"{sid} not visible to a second node"
    start = time.perf_counter()
    materialized = await b.repo.materialize(found, b.bundle)
    samples["fetch"] = ms_since(start)
    assert materialized.image is not None and (materialized.image / "pages.img").is_file()
    (work / "got").mkdir()
    start = time.perf_counter()
    for name in files:
        await bare_get(bare, f"{sid}/{name}", work / "got" / name)
    samples["bare_get"] = ms_since(start)
    if backend == "posix_fs" and isinstance(location, PosixLocation):
        (work / "got-copy").mkdir()
        start = time.perf_counter()
        for ref in snapshot.manifest.memory:
            source = location.root / blob_key(ref.digest)
            await asyncio.to_thread(copy_synced, source, work / "got-copy" / ref.name)
        samples["bare_copy_back"] = ms_since(start)
    # Clean up (untimed): the manifest, the image's blobs, the bare objects, local copies.
    await a.repo.delete(sid)
    for ref in snapshot.manifest.memory:
        await a.repo.store.delete(blob_key(ref.digest))
        a.repo.cache.path(ref.digest).unlink(missing_ok=True)
    for name in files:
        await obstore.delete_async(bare, f"{sid}/{name}")
    await asyncio.to_thread(shutil.rmtree, work, True)
    if not warm:
        for key, ms in samples.items():
            report.add(f"storage_{backend}_{mib}_{key}", ms)
    log(
        f"  {backend} {mib} MiB{' (warm-up)' if warm else ''}: "
        + ", ".join(f"{k} {v:.0f}" for k, v in samples.items())
        + " ms"
    )


async def _measure(
    report: Report, s3: S3Server, scratch: Path, runs: int, sizes: tuple[int, ...]
) -> None:
    locations: dict[str, Location] = {
        "posix_fs": PosixLocation("posix_fs", scratch / "posix-repository"),
        "s3": s3.location(f"storage-{secrets.token_hex(4)}"),
    }
    nodes = {
        k: await new_node(scratch / f"a-{k}", loc, with_layer=True) for k, loc in locations.items()
    }
    bares = {k: bare_store(loc, scratch) for k, loc in locations.items()}
    for mib in sizes:
        for i in range(runs + 1):
            for backend in BACKENDS:
                await one_round(
                    backend,
                    nodes[backend],
                    locations[backend],
                    bares[backend],
                    scratch,
                    mib,
                    i == 0,
                    report,
                )


#: The rows of one (backend, size): name, sample, bare sample, bare name, plotted.
ROWS = (
    ("commit {mib} MiB image", "commit", "bare_put", "obstore put, same bytes", True),
    (
        "fetch {mib} MiB (materialize, fresh node)",
        "fetch",
        "bare_get",
        "obstore get → file + fsync",
        True,
    ),
)
POSIX_ROWS = (
    ("{mib} MiB: commit next to a copy", "commit", "bare_copy", "file copy + fsync", False),
    ("{mib} MiB: commit next to hashing", "commit", "sha256", "sha256 of the bytes", False),
    ("{mib} MiB: fetch next to a copy", "fetch", "bare_copy_back", "file copy + fsync", False),
)  # fmt: skip


def measure_storage(
    report: Report, s3: S3Server, scratch: Path, runs: int, sizes: tuple[int, ...] = SIZES_MIB
) -> None:
    asyncio.run(_measure(report, s3, scratch, runs, sizes))
    for mib in sizes:
        for backend in BACKENDS:
            key = f"storage_{backend}_{mib}"
            rows = ROWS + (POSIX_ROWS if backend == "posix_fs" else ())
            for name, sample, bare, bare_name, plot in rows:
                title = f"{backend}: " + name.format(mib=mib)
                report.rows.append(SizedRow(
                    "storage", title, report.lat(f"{key}_{sample}"),
                    report.lat(f"{key}_{bare}"), bare_name, mib=mib, plot=plot,
                    plot_name=title.split(" (")[0]))  # fmt: skip
