"""The snapshot repository over both backends: a posix directory and a real S3 server (moto).

Every test that touches the store runs twice: ``posix_fs`` in the test's own directory, and
``s3`` under a fresh prefix of the session's moto server. A "node" is one
:class:`SnapshotRepository` with its own staging, blob cache, images and layer store; two nodes
on one store are what two machines sharing a repository look like. Memory images are three
files of random bytes and the envd bundle is a small directory: the repository treats both as
opaque blobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aenv.core.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from aenv.storage.artifacts import Artifacts
from aenv.storage.blobs import BlobCache, blob_key, digest_of_key
from aenv.storage.layers import LayerStore, layer_id_for
from aenv.storage.manifest import Blob
from aenv.storage.objects import Location, ObjectStore, PosixLocation
from aenv.storage.repository import (
    IMAGE_FILES,
    Snapshot,
    SnapshotDraft,
    SnapshotManifest,
    SnapshotRepository,
    Staged,
    manifest_key,
)
from tests.s3 import S3Server, needs_moto, run_s3_server
from tests.storage.conftest import needs_root
from tests.storage.trees import make_layer_tree, tree_state

pytestmark = [pytest.mark.anyio, needs_root]

log = logging.getLogger("tests.storage.test_repository")

#: The two layers every snapshot here sits on (the recipe only has to be unique).
BASE = layer_id_for({"test": "base"})
TOP = layer_id_for({"test": "top"})
#: An unreachable S3 endpoint must fail a commit well within this (measured: see the test).
DOWN_ERROR_BOUND_S = 60.0


class Crash(Exception):
    """The process dies here (raised by a store double instead of doing the write)."""


class Store(ObjectStore):
    """The real store, recording writes; ``before_put`` runs first (and may raise)."""

    def __init__(self, location: Location) -> None:
        super().__init__(location)
        self.puts: list[str] = []
        self.before_put: Callable[[str], None] | None = None

    async def put_bytes(self, key: str, data: bytes, *, create: bool = False) -> None:
        self._before(key)
        await super().put_bytes(key, data, create=create)
        self.puts.append(key)

    async def put_file(self, key: str, path: Path) -> None:
        self._before(key)
        await super().put_file(key, path)
        self.puts.append(key)

    def _before(self, key: str) -> None:
        if self.before_put is not None:
            self.before_put(key)


@dataclass
class Node:
    home: Path
    store: Store
    repo: SnapshotRepository
    layers: LayerStore
    #: The node's own envd bundle directory.
    bundle: Path
    #: What each committed snapshot's memory files held, by snapshot id and file name.
    images: dict[str, dict[str, bytes]] = field(default_factory=dict, repr=False)

    def layer(self, layer_id: str) -> Path:
        return self.layers.path(layer_id)


def make_bundle(path: Path, content: str = "envd 1") -> Path:
    """A stand-in envd bundle; equal ``content`` gives equal trees (mtimes set)."""
    path.mkdir(parents=True)
    (path / "envd").write_text(content)
    (path / "envd").chmod(0o755)
    (path / "lib").mkdir()
    (path / "lib" / "data").write_bytes(content.encode() * 100)
    for rel in ("envd", "lib/data", "lib", "."):
        os.utime(path / rel, (1_700_000_000, 1_700_000_000))
    return path


async def add_layer(layers: LayerStore, layer_id: str, variant: str) -> Path:
    async with layers.staging(layer_id) as staging:
        make_layer_tree(staging, variant=variant)
        layer = await layers.put_from_dir(staging, layer_id)
    return layer.path


async def new_node(
    home: Path, location: Location, *, bundle: str = "envd 1", with_layers: bool = True
) -> Node:
    store = Store(location)
    layers = LayerStore(home / "layers")
    cache = BlobCache(home / "cache" / "blobs")
    repo = SnapshotRepository(
        store, Artifacts(home / "cache", layers, cache), home / "staging", home / "cache" / "images"
    )
    await repo.start()
    if with_layers:
        await add_layer(layers, BASE, "base")
        await add_layer(layers, TOP, "top")
    return Node(home, store, repo, layers, make_bundle(home / "envd-bundle", bundle))


def draft(snapshot_id: str, **fields: Any) -> SnapshotDraft:
    base: dict[str, Any] = {
        "snapshot_id": snapshot_id,
        "template_id": "base",
        "created_at": 1000.0,
        "cpu_count": 2,
        "memory_mb": 512,
    }
    base.update(fields)
    return SnapshotDraft(**base)


def write_image(staged: Staged, files: tuple[str, ...] = IMAGE_FILES) -> dict[str, bytes]:
    """What a runsc checkpoint leaves behind: here, random bytes."""
    staged.memory_dir.mkdir()
    written: dict[str, bytes] = {}
    for name in files:
        written[name] = secrets.token_bytes(1000 + len(written) * 4096)
        (staged.memory_dir / name).write_bytes(written[name])
    return written


async def commit(
    node: Node,
    snapshot_id: str,
    *,
    layers: tuple[str, ...] = (BASE, TOP),
    memory: bool = True,
    **fields: Any,
) -> Snapshot:
    staged = node.repo.stage(snapshot_id)
    image = write_image(staged) if memory else {}
    snapshot = await node.repo.commit(
        staged,
        draft(snapshot_id, **fields),
        layers=[node.layer(layer_id) for layer_id in layers],
        envd_bundle=node.bundle,
        memory=memory,
    )
    node.images[snapshot_id] = image
    return snapshot


async def blob_digests(store: ObjectStore) -> set[str]:
    found = set()
    for info in await store.list("blobs/"):
        digest = digest_of_key(info.key)
        assert digest is not None, f"not a blob key: {info.key}"
        found.add(digest)
    return found


async def manifest_ids(store: ObjectStore) -> list[str]:
    return sorted(
        info.key.removeprefix("manifests/").removesuffix(".json")
        for info in await store.list("manifests/")
    )


def ids(snapshots: list[Snapshot]) -> list[str]:
    return [s.snapshot_id for s in snapshots]


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(params=["posix_fs", pytest.param("s3", marks=needs_moto)])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "posix_fs":
        return PosixLocation(kind="posix_fs", root=tmp_path / "repository")
    server: S3Server = request.getfixturevalue("s3_server")
    return server.location()


@pytest.fixture
async def node_a(tmp_path: Path, location: Location) -> AsyncIterator[Node]:
    yield await new_node(tmp_path / "a", location)


@pytest.fixture
async def node_b(tmp_path: Path, location: Location) -> AsyncIterator[Node]:
    """Another machine on the same repository: nothing local in common with ``node_a``."""
    yield await new_node(tmp_path / "b", location, bundle="envd 2", with_layers=False)


@pytest.fixture
async def posix_node(tmp_path: Path) -> AsyncIterator[Node]:
    """For what does not depend on the backend."""
    yield await new_node(tmp_path / "p", PosixLocation(kind="posix_fs", root=tmp_path / "repo"))


# -- commit ---------------------------------------------------------------------------------


async def test_commit_puts_every_blob_then_the_manifest(node_a: Node, node_b: Node) -> None:
    full = draft(
        "snap-1",
        names=["mine", "other"],
        kind="template",
        source_sandbox_id="sbx1",
        requirements={"runsc": "release-20260101", "platform": "systrap"},
        default_user="root",
        default_workdir="/work",
        env_vars={"A": "1"},
        metadata={"team": "x"},
        envd_token="s3cret-token",
        sandbox={"sandbox_id": "sbx1", "timeout": 300},
    )
    staged = node_a.repo.stage("snap-1")
    assert staged.path.parent == node_a.repo.staging and staged.path.is_dir()
    assert staged.path.stat().st_mode & 0o777 == 0o700
    assert not staged.memory_dir.exists()  # runsc's checkpoint creates it
    image = write_image(staged)

    snap = await node_a.repo.commit(
        staged, full, layers=[node_a.layer(BASE), node_a.layer(TOP)],
        envd_bundle=node_a.bundle,
    )  # fmt: skip

    manifest = snap.manifest
    assert manifest.model_dump(exclude={"format", "layers", "memory", "envd_bundle", "disk"}) == (
        full.model_dump()
    )
    assert [layer.layer_id for layer in manifest.layers] == [BASE, TOP]
    assert [f.name for f in manifest.memory] == list(IMAGE_FILES)
    assert [f.size for f in manifest.memory] == [len(image[n]) for n in IMAGE_FILES]
    assert manifest.memory_size_bytes == sum(len(b) for b in image.values())
    assert "s3cret-token" not in repr(snap) and snap.manifest.envd_token == "s3cret-token"
    # Every blob is in the store with its size, the manifest is there and is what was indexed.
    for digest in manifest.digests():
        assert await node_a.store.head(blob_key(digest)) is not None
    assert await blob_digests(node_a.store) == manifest.digests()
    for ref in [*manifest.layers, *manifest.memory, manifest.envd_bundle]:
        info = await node_a.store.head(blob_key(ref.digest))
        assert info is not None and info.size == ref.size
    assert node_a.store.puts[-1] == manifest_key("snap-1")  # the manifest last
    stored = SnapshotManifest.model_validate_json(
        await node_a.store.get_bytes(manifest_key("snap-1"))
    )
    assert stored == manifest
    # Locally: indexed, the image kept for restores here, staging gone.
    assert not staged.path.exists()
    assert node_a.repo.get("snap-1") == snap and await node_a.repo.require("snap-1") == snap
    for name in IMAGE_FILES:
        assert (node_a.repo.images / "snap-1" / name).read_bytes() == image[name]
    # Another node reads it field for field.
    again = await node_b.repo.require("snap-1")
    assert again.manifest == manifest and again.manifest.envd_token == "s3cret-token"


async def test_another_node_materializes_it(node_a: Node, node_b: Node, tmp_path: Path) -> None:
    snap = await commit(node_a, "snap-1")
    assert node_b.repo.get("snap-1") is None  # node B listed the store before the commit
    found = await node_b.repo.lookup("snap-1")  # an id it does not know: refreshed
    assert found is not None and found.manifest == snap.manifest
    assert not node_b.layers.has(BASE) and not node_b.layers.has(TOP)

    got = await node_b.repo.materialize(found, node_b.bundle)

    # Layers imported into B's layer store under their ids, the same trees as on A.
    assert got.layers == (node_b.layer(BASE), node_b.layer(TOP))
    for layer_id in (BASE, TOP):
        assert tree_state(node_b.layer(layer_id)) == tree_state(node_a.layer(layer_id))
    # The memory image, byte for byte, where runsc will read it.
    assert got.image == node_b.repo.images / "snap-1"
    assert sorted(os.listdir(got.image)) == sorted(IMAGE_FILES)
    for name in IMAGE_FILES:
        assert (got.image / name).read_bytes() == node_a.images["snap-1"][name]
    # B's own bundle differs ("envd 2"): A's was fetched, and it is A's tree.
    assert got.envd_bundle != node_b.bundle
    assert got.envd_bundle.is_relative_to(node_b.home)
    assert tree_state(got.envd_bundle) == tree_state(node_a.bundle)

    # Again: everything is local now, so nothing is fetched (the store could be gone).
    node_b.repo.store = Store(PosixLocation(kind="posix_fs", root=tmp_path / "nowhere"))
    assert await node_b.repo.materialize(found, node_b.bundle) == got


async def test_a_node_with_the_same_bundle_uses_its_own(
    node_a: Node, location: Location, tmp_path: Path
) -> None:
    await commit(node_a, "snap-1")
    node_c = await new_node(tmp_path / "c", location, bundle="envd 1", with_layers=False)
    got = await node_c.repo.materialize(await node_c.repo.require("snap-1"), node_c.bundle)
    assert got.envd_bundle == node_c.bundle
    assert not (node_c.home / "cache" / "bundles").exists() or [
        p.name for p in (node_c.home / "cache" / "bundles").iterdir()
    ] == [".staging"]


async def test_a_filesystem_only_snapshot(node_a: Node, node_b: Node) -> None:
    snap = await commit(node_a, "fs-only", memory=False)
    assert snap.manifest.memory == [] and snap.manifest.memory_size_bytes == 0
    assert not (node_a.repo.images / "fs-only").exists()
    got = await node_b.repo.materialize(await node_b.repo.require("fs-only"), node_b.bundle)
    assert got.image is None and got.layers == (node_b.layer(BASE), node_b.layer(TOP))


async def test_shared_blobs_are_stored_once(node_a: Node, tmp_path: Path) -> None:
    one = await commit(node_a, "one")
    two = await commit(node_a, "two", layers=(BASE,))
    layer_puts = [k for k in node_a.store.puts if k == blob_key(one.manifest.layers[0].digest)]
    assert len(layer_puts) == 1
    assert node_a.store.puts.count(blob_key(one.manifest.envd_bundle.digest)) == 1
    assert await blob_digests(node_a.store) == one.manifest.digests() | two.manifest.digests()
    assert len(await blob_digests(node_a.store)) == 2 + 1 + 2 * len(IMAGE_FILES)

    # Another node with its own build of the same layer (same content, other inodes) and the
    # same bundle: its export has the same digest, so it puts only its memory image.
    node_c = await new_node(tmp_path / "c", node_a.store.location, bundle="envd 1")
    three = await commit(node_c, "three", layers=(BASE,))
    assert three.manifest.layers == two.manifest.layers
    assert three.manifest.envd_bundle == two.manifest.envd_bundle
    memory_keys = {blob_key(f.digest) for f in three.manifest.memory}
    assert set(node_c.store.puts) == memory_keys | {manifest_key("three")}
    assert len(await blob_digests(node_a.store)) == 2 + 1 + 3 * len(IMAGE_FILES)
    assert node_a.repo.referenced_digests() == one.manifest.digests() | two.manifest.digests()
    await node_a.repo.refresh(force=True)
    assert node_a.repo.referenced_digests() == await blob_digests(node_a.store)


# -- one id, two writers ----------------------------------------------------------------------


async def test_two_nodes_commit_one_id_exactly_one_wins(
    node_a: Node, location: Location, tmp_path: Path
) -> None:
    node_c = await new_node(tmp_path / "c", location, bundle="envd 3")
    staged = [node.repo.stage("same") for node in (node_a, node_c)]
    for s in staged:
        write_image(s)
    results = await asyncio.gather(
        *(
            node.repo.commit(
                s, draft("same", created_at=float(i)), layers=[node.layer(BASE)],
                envd_bundle=node.bundle,
            )
            for i, (node, s) in enumerate(zip((node_a, node_c), staged, strict=True))
        ),
        return_exceptions=True,
    )  # fmt: skip
    winners = [r for r in results if isinstance(r, Snapshot)]
    assert len(winners) == 1, results
    assert sum(isinstance(r, AlreadyExists) for r in results) == 1, results
    winner = winners[0]
    loser = (node_c, node_a)[int(winner.manifest.created_at)]
    # The store holds the winner's manifest; both nodes agree on it after a refresh.
    stored = SnapshotManifest.model_validate_json(
        await node_a.store.get_bytes(manifest_key("same"))
    )
    assert stored == winner.manifest
    await loser.repo.refresh(force=True)
    assert (await loser.repo.require("same")).manifest == winner.manifest
    # The loser's staged directory is left for it to discard.
    lost = staged[(node_a, node_c).index(loser)]
    assert lost.path.is_dir()
    await loser.repo.discard(lost)
    assert not lost.path.exists()


async def test_an_id_taken_elsewhere_is_already_exists(node_a: Node, node_b: Node) -> None:
    await commit(node_a, "snap-1", created_at=1.0)
    await add_layer(node_b.layers, BASE, "base")
    # B's index was read before A's commit: only the conditional create can catch this.
    assert node_b.repo.get("snap-1") is None
    staged = node_b.repo.stage("snap-1")
    write_image(staged)
    with pytest.raises(AlreadyExists):
        await node_b.repo.commit(
            staged, draft("snap-1", created_at=2.0), layers=[node_b.layer(BASE)],
            envd_bundle=node_b.bundle,
        )  # fmt: skip
    assert (await node_b.repo.require("snap-1")).manifest.created_at == 1.0
    # Here, where the index knows it, a second commit fails before putting anything.
    staged = node_a.repo.stage("snap-1")
    write_image(staged)
    before = list(node_a.store.puts)
    with pytest.raises(AlreadyExists):
        await node_a.repo.commit(
            staged, draft("snap-1"), layers=[node_a.layer(BASE)], envd_bundle=node_a.bundle
        )
    assert node_a.store.puts == before
    await node_a.repo.discard(staged)


async def test_concurrent_commits_of_one_id_on_one_node(node_a: Node) -> None:
    staged = [node_a.repo.stage("snap-1") for _ in range(2)]
    for s in staged:
        write_image(s)
    results = await asyncio.gather(
        *(
            node_a.repo.commit(
                s, draft("snap-1", created_at=float(i)), layers=[node_a.layer(BASE)],
                envd_bundle=node_a.bundle,
            )
            for i, s in enumerate(staged)
        ),
        return_exceptions=True,
    )  # fmt: skip
    assert sum(isinstance(r, Snapshot) for r in results) == 1, results
    assert sum(isinstance(r, AlreadyExists) for r in results) == 1, results
    winner = next(r for r in results if isinstance(r, Snapshot))
    assert await node_a.repo.require("snap-1") == winner


# -- failures -------------------------------------------------------------------------------


async def test_a_crash_before_the_manifest_leaves_nothing_visible(
    node_a: Node, node_b: Node, location: Location
) -> None:
    def crash_at_manifest(key: str) -> None:
        if key.startswith("manifests/"):
            raise Crash(key)

    node_a.store.before_put = crash_at_manifest
    staged = node_a.repo.stage("snap-1")
    write_image(staged)
    with pytest.raises(Crash):
        await node_a.repo.commit(
            staged, draft("snap-1"), layers=[node_a.layer(BASE)], envd_bundle=node_a.bundle
        )
    # Every blob went in; the manifest did not, so nobody sees a snapshot.
    assert len(await blob_digests(node_a.store)) == 1 + 1 + len(IMAGE_FILES)
    assert await manifest_ids(node_a.store) == []
    assert node_a.repo.get("snap-1") is None and node_a.repo.list(kind=None) == []
    assert await node_b.repo.lookup("snap-1") is None
    assert not (node_a.repo.images / "snap-1").exists()

    # The node restarts on the same home: the half-made snapshot's staging is swept.
    restarted = SnapshotRepository(
        ObjectStore(location), node_a.repo.artifacts, node_a.repo.staging, node_a.repo.images
    )
    assert await restarted.start() == [str(staged.path)]
    assert not staged.path.exists() and restarted.get("snap-1") is None
    # The id is free; a retry finds the blobs already there and puts only the manifest.
    node_a.store.before_put = None
    node_a.store.puts.clear()
    snap = await commit(node_a, "snap-1", layers=(BASE,))
    assert blob_key(snap.manifest.layers[0].digest) not in node_a.store.puts
    assert await node_b.repo.lookup("snap-1") is not None


async def test_an_incomplete_image_is_refused(node_a: Node) -> None:
    for present in [(), ("checkpoint.img", "pages.img"), None]:
        staged = node_a.repo.stage("snap-1")
        if present is not None:  # None: not even the memory directory
            write_image(staged, present)
        with pytest.raises(FailedPrecondition, match="memory image incomplete"):
            await node_a.repo.commit(
                staged, draft("snap-1"), layers=[node_a.layer(BASE)], envd_bundle=node_a.bundle
            )
        await node_a.repo.discard(staged)
        assert not staged.path.exists()
        await node_a.repo.discard(staged)  # idempotent
    assert node_a.repo.get("snap-1") is None and await manifest_ids(node_a.store) == []
    assert node_a.store.puts == []


@pytest.mark.parametrize("which", ["memory", "layer"])
async def test_a_corrupt_blob_is_data_loss_and_never_cached(
    node_a: Node, node_b: Node, which: str
) -> None:
    snap = await commit(node_a, "snap-1")
    ref = snap.manifest.memory[1] if which == "memory" else snap.manifest.layers[1]
    key = blob_key(ref.digest)
    good = await node_a.store.get_bytes(key)
    # Same size, one byte flipped; written as a new object (on posix the stored blob is a hard
    # link of A's cache: a rewrite in place would corrupt A's copy too).
    bad = good[:100] + bytes([good[100] ^ 0xFF]) + good[101:]
    await node_a.store.put_bytes(key, bad)

    with pytest.raises(DataLoss, match="corrupt"):
        await node_b.repo.materialize(await node_b.repo.require("snap-1"), node_b.bundle)
    assert not node_b.repo.cache.has(ref.digest)
    assert os.listdir(node_b.repo.cache.root / ".partial") == []
    assert not (node_b.repo.images / "snap-1").exists()
    if which == "layer":  # the layers come first: the memory image was not even fetched
        assert not node_b.layers.has(TOP)
        assert os.listdir(node_b.layers.root / ".staging") == []
        assert not any(node_b.repo.cache.has(f.digest) for f in snap.manifest.memory)
    # A truncated blob too.
    await node_a.store.put_bytes(key, good[:-1])
    with pytest.raises(DataLoss, match="corrupt"):
        await node_b.repo.materialize(await node_b.repo.require("snap-1"), node_b.bundle)
    assert not node_b.repo.cache.has(ref.digest)
    # Repaired, it materializes.
    await node_a.store.put_bytes(key, good)
    got = await node_b.repo.materialize(await node_b.repo.require("snap-1"), node_b.bundle)
    assert got.image is not None and node_b.repo.cache.has(ref.digest)


async def test_a_missing_blob_is_not_found(node_a: Node, node_b: Node) -> None:
    snap = await commit(node_a, "snap-1")
    await node_a.store.delete(blob_key(snap.manifest.memory[0].digest))
    with pytest.raises(NotFound):
        await node_b.repo.materialize(await node_b.repo.require("snap-1"), node_b.bundle)
    assert not (node_b.repo.images / "snap-1").exists()


@needs_moto
async def test_s3_down_during_commit_is_unavailable_quickly(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    with run_s3_server() as server:
        node = await new_node(tmp_path / "a", server.location("down"))
        await commit(node, "before")
        stopped_at: list[float] = []

        def stop_at_first_blob(key: str) -> None:
            # The server dies as the commit starts putting blobs: the first put fails too.
            if key.startswith("blobs/") and not stopped_at:
                server.stop()
                stopped_at.append(time.monotonic())

        node.store.before_put = stop_at_first_blob
        staged = node.repo.stage("snap-1")
        write_image(staged)
        with pytest.raises(Unavailable, match="repository s3://aenv-test/down") as caught:
            await node.repo.commit(
                staged, draft("snap-1"), layers=[node.layer(BASE)], envd_bundle=node.bundle
            )
        elapsed = time.monotonic() - stopped_at[0]
        record_property("s3_down_error_s", round(elapsed, 3))
        log.warning("S3 down: commit failed with Unavailable after %.3f s", elapsed)
        assert elapsed < DOWN_ERROR_BOUND_S, caught.value
        # Nothing indexed; the staged image is kept for a retry or a discard.
        assert node.repo.get("snap-1") is None and ids(node.repo.list()) == ["before"]
        assert staged.path.is_dir() and not (node.repo.images / "snap-1").exists()
        # Listing fails the same way (a node does not start on a repository it cannot read).
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await node.repo.refresh(force=True)
        with pytest.raises(Unavailable):
            await new_node(tmp_path / "b", server.location("down"), with_layers=False)
        assert time.monotonic() - started < DOWN_ERROR_BOUND_S

        # Back (empty: moto keeps objects in memory): the staged snapshot commits now.
        node.store.before_put = None
        server.start()
        await node.repo.refresh(force=True)
        assert node.repo.list(kind=None) == []
        snap = await node.repo.commit(
            staged, draft("snap-1"), layers=[node.layer(BASE)], envd_bundle=node.bundle
        )
        assert await blob_digests(node.store) == snap.manifest.digests()
        assert await manifest_ids(node.store) == ["snap-1"]


# -- delete, index --------------------------------------------------------------------------


async def test_delete_is_seen_by_every_node(node_a: Node, node_b: Node) -> None:
    gone = await commit(node_a, "snap-1")
    kept = await commit(node_a, "snap-2")
    await node_b.repo.materialize(await node_b.repo.require("snap-1"), node_b.bundle)
    assert (node_b.repo.images / "snap-1").is_dir()

    await node_a.repo.delete("snap-1")

    assert node_a.repo.get("snap-1") is None and await node_a.repo.lookup("snap-1") is None
    assert not (node_a.repo.images / "snap-1").exists()
    assert await manifest_ids(node_a.store) == ["snap-2"]
    # Its blobs stay until GC (they may be shared; here the layers are).
    assert gone.manifest.digests() <= await blob_digests(node_a.store)
    await node_b.repo.refresh(force=True)
    assert node_b.repo.get("snap-1") is None and await node_b.repo.lookup("snap-1") is None
    assert ids(node_b.repo.list()) == ["snap-2"]
    for node in (node_a, node_b):
        with pytest.raises(NotFound, match="snapshot snap-1 not found"):
            await node.repo.require("snap-1")
        with pytest.raises(NotFound):
            await node.repo.delete("snap-1")
        with pytest.raises(NotFound):
            await node.repo.delete("unknown")
    assert (await node_b.repo.require("snap-2")).manifest == kept.manifest
    # The id is free again, for any node.
    assert node_b.layers.has(BASE)  # imported by the materialize above
    again = await commit(node_b, "snap-1", layers=(BASE,), created_at=5.0)
    assert (await node_a.repo.require("snap-1")).manifest == again.manifest


async def test_list_filters_and_orders_newest_first(node_a: Node, node_b: Node) -> None:
    for snapshot_id, fields in [
        ("a", {"created_at": 10.0, "source_sandbox_id": "sbx1", "names": ["n"]}),
        ("b", {"created_at": 30.0, "source_sandbox_id": "sbx2", "names": ["n", "m"]}),
        ("c", {"created_at": 20.0, "source_sandbox_id": "sbx1"}),
        ("d", {"created_at": 20.0, "source_sandbox_id": "sbx1"}),  # ties: id descending
        ("t", {"created_at": 40.0, "kind": "template", "names": ["n"]}),
        ("p", {"created_at": 50.0, "kind": "paused", "source_sandbox_id": "sbx1"}),
    ]:
        await commit(node_a, snapshot_id, memory=False, layers=(BASE,), **fields)
    await node_b.repo.refresh(force=True)
    for repo in (node_a.repo, node_b.repo):  # the writer's index and a reader's agree
        assert ids(repo.list()) == ["b", "d", "c", "a"]
        assert ids(repo.list(kind=None)) == ["p", "t", "b", "d", "c", "a"]
        assert ids(repo.list(kind="template")) == ["t"]
        assert ids(repo.list(kind="paused")) == ["p"]
        assert ids(repo.list(sandbox_id="sbx1")) == ["d", "c", "a"]
        assert ids(repo.list(sandbox_id="sbx1", kind=None)) == ["p", "d", "c", "a"]
        assert ids(repo.list(sandbox_id="nope")) == []
        assert ids(repo.list(name="n")) == ["b", "a"]
        assert ids(repo.list(name="n", kind=None)) == ["t", "b", "a"]
        assert ids(repo.list(name="n", sandbox_id="sbx1")) == ["a"]
        assert ids(repo.list(name="m")) == ["b"]


async def test_find_by_id_else_newest_with_the_name(node_a: Node, node_b: Node) -> None:
    for snapshot_id, created_at, names in [
        ("old", 1.0, ["prod"]), ("new", 2.0, ["prod"]), ("prod-id", 0.5, ["x"]),
        ("shadow", 3.0, ["prod-id"]),
    ]:  # fmt: skip
        await commit(node_a, snapshot_id, memory=False, layers=(BASE,), created_at=created_at,
                     names=names)  # fmt: skip
    await node_b.repo.refresh(force=True)
    for repo in (node_a.repo, node_b.repo):
        assert ids([s for s in [repo.find("prod")] if s]) == ["new"]
        assert ids([s for s in [repo.find("old")] if s]) == ["old"]
        # An id wins over a newer snapshot carrying it as a name.
        assert ids([s for s in [repo.find("prod-id")] if s]) == ["prod-id"]
        assert repo.find("nothing") is None and repo.find("../etc") is None
    await node_a.repo.delete("new")
    await node_b.repo.refresh(force=True)
    for repo in (node_a.repo, node_b.repo):
        found = await repo.lookup("prod")
        assert found is not None and found.snapshot_id == "old"


async def test_a_malformed_manifest_is_skipped_not_deleted(
    node_a: Node, node_b: Node, caplog: pytest.LogCaptureFixture
) -> None:
    good = await commit(node_a, "good", memory=False, layers=(BASE,))
    data = good.manifest.model_dump()
    bad: dict[str, bytes] = {
        "bad": b"{not json",
        "wrong": good.manifest.model_copy(update={"snapshot_id": "other"})
        .model_dump_json()
        .encode(),
        "extra": good.manifest.model_dump_json()[:-1].encode() + b', "surprise": 1}',
        "newer": SnapshotManifest(**{**data, "snapshot_id": "newer", "format": 3})
        .model_dump_json()
        .encode(),
        "v1": b'{"format": 1, "snapshot_id": "v1", "path": "/home/aenv/repository/v1"}',
    }
    for name, raw in bad.items():
        await node_a.store.put_bytes(manifest_key(name), raw)
    await node_a.store.put_bytes("manifests/not-json.txt", b"ignored")
    await node_a.store.put_bytes("manifests/.hidden.json", b"ignored")

    with caplog.at_level(logging.ERROR, logger="aenv.storage.repository"):
        await node_b.repo.refresh(force=True)
    assert ids(node_b.repo.list(kind=None)) == ["good"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for name in bad:
        assert f"manifests/{name}.json" in logged, logged
        assert node_b.repo.get(name) is None and await node_b.repo.lookup(name) is None
    # Nothing deleted, and the ids stay taken: the store's conditional create says so.
    listed = {info.key for info in await node_a.store.list("manifests/")}
    assert {manifest_key(name) for name in bad} <= listed
    await add_layer(node_b.layers, BASE, "base")
    for name in bad:
        staged = node_b.repo.stage(name)
        with pytest.raises(AlreadyExists):
            await node_b.repo.commit(staged, draft(name), layers=[node_b.layer(BASE)],
                                     envd_bundle=node_b.bundle, memory=False)  # fmt: skip
        await node_b.repo.discard(staged)


async def test_start_sweeps_staging(location: Location, tmp_path: Path) -> None:
    node = await new_node(tmp_path / "a", location)
    staged = node.repo.stage("snap-1")
    write_image(staged)
    other = node.repo.stage("snap-2")
    assert node.repo.get("snap-1") is None and node.repo.list(kind=None) == []
    # The process dies here; the next one starts on the same directories.
    again = SnapshotRepository(node.store, node.repo.artifacts, node.repo.staging, node.repo.images)
    assert sorted(await again.start()) == sorted([str(staged.path), str(other.path)])
    assert os.listdir(node.repo.staging) == []
    assert again.get("snap-1") is None and await manifest_ids(node.store) == []


# -- backend-independent --------------------------------------------------------------------


async def test_commit_refuses_a_mismatched_draft_or_a_foreign_path(
    posix_node: Node, tmp_path: Path
) -> None:
    repo = posix_node.repo
    layers = [posix_node.layer(BASE)]
    staged = repo.stage("snap-1")
    write_image(staged)
    with pytest.raises(InvalidArgument):
        await repo.commit(staged, draft("snap-2"), layers=layers, envd_bundle=posix_node.bundle)
    foreign = Staged("snap-1", tmp_path / "elsewhere.x")
    foreign.path.mkdir()
    with pytest.raises(InvalidArgument):
        await repo.commit(foreign, draft("snap-1"), layers=layers, envd_bundle=posix_node.bundle)
    with pytest.raises(InvalidArgument):
        await repo.discard(foreign)
    assert foreign.path.is_dir()  # never deleted
    assert await manifest_ids(posix_node.store) == [] and posix_node.store.puts == []


@pytest.mark.parametrize(
    "bad", ["", "../x", "..", ".", ".hidden", "a/b", "a" * 65, "a b", "é", "a\x00b", "/abs"]
)
async def test_bad_ids_never_become_keys_or_paths(posix_node: Node, bad: str) -> None:
    repo = posix_node.repo
    with pytest.raises(InvalidArgument):
        repo.stage(bad)
    with pytest.raises(InvalidArgument):
        await repo.commit(
            Staged(bad, repo.staging / f"{bad}.x"), draft(bad), layers=[],
            envd_bundle=posix_node.bundle,
        )  # fmt: skip
    assert repo.get(bad) is None and repo.find(bad) is None
    assert await repo.lookup(bad) is None
    with pytest.raises(NotFound):
        await repo.require(bad)
    with pytest.raises(NotFound):
        await repo.delete(bad)
    assert posix_node.store.puts == []


@pytest.mark.parametrize("good", ["a", "a" * 64, "A.b_c-9", "-x", "_", "snap..", "x.json"])
async def test_good_ids_round_trip(posix_node: Node, tmp_path: Path, good: str) -> None:
    snap = await commit(posix_node, good, memory=False, layers=(BASE,))
    assert await posix_node.repo.require(good) == snap
    other = await new_node(tmp_path / "o", posix_node.store.location, with_layers=False)
    assert (await other.repo.require(good)).manifest == snap.manifest


async def test_referenced_digests(posix_node: Node) -> None:
    assert posix_node.repo.referenced_digests() == set()
    a = await commit(posix_node, "a", layers=(BASE, TOP))
    b = await commit(posix_node, "b", layers=(BASE,), kind="template", memory=False)
    assert posix_node.repo.referenced_digests() == a.manifest.digests() | b.manifest.digests()
    assert len(a.manifest.digests()) == 2 + 1 + len(IMAGE_FILES)
    await posix_node.repo.delete("a")
    assert posix_node.repo.referenced_digests() == b.manifest.digests()


def test_manifest_is_strict_and_frozen() -> None:
    digest = "sha256:" + "0" * 64
    m = SnapshotManifest(
        **draft("a").model_dump(), layers=[], envd_bundle=Blob(digest=digest, size=1)
    )
    assert m.format == 2 and m.names == [] and m.kind == "snapshot" and m.memory == []
    with pytest.raises(ValueError, match="surprise"):
        SnapshotManifest.model_validate({**m.model_dump(), "surprise": 1})
    with pytest.raises(ValueError, match="kind"):
        draft("a", kind="other")
    with pytest.raises(ValueError, match="digest"):
        Blob.model_validate({"digest": "/host/path", "size": 1})
    with pytest.raises(ValueError, match="frozen"):
        m.cpu_count = 4
