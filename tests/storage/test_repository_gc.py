"""Garbage collection of the repository, on both backends: only what no manifest names goes,
never a blob a commit in flight needs, and commits and GC passes may run at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.storage.blobs import blob_key
from aenv.storage.objects import Location
from tests.storage.conftest import needs_root
from tests.storage.test_repository import (
    BASE,
    Node,
    blob_digests,
    commit,
    location,
    new_node,
)

__all__ = ["location"]  # the fixture, parametrized over both backends

pytestmark = [pytest.mark.anyio, needs_root]


async def _missing(node: Node) -> dict[str, set[str]]:
    """Per indexed manifest, the blobs it names that the store lacks."""
    await node.repo.refresh(force=True)
    have = await blob_digests(node.store)
    return {s.snapshot_id: s.manifest.digests() - have
            for s in node.repo.list(kind=None) if s.manifest.digests() - have}


async def test_gc_deletes_only_unreferenced_blobs(tmp_path: Path, location: Location) -> None:
    node = await new_node(tmp_path / "a", location)
    kept = await commit(node, "kept")
    doomed = await commit(node, "doomed")
    await node.repo.delete("doomed")
    plan = await node.repo.collect_garbage(grace_s=0)
    unique = doomed.manifest.digests() - kept.manifest.digests()
    assert set(plan.delete) == {blob_key(d) for d in unique}
    assert await _missing(node) == {}
    assert kept.manifest.digests() <= await blob_digests(node.store)
    assert not unique & await blob_digests(node.store)
    # A second pass finds nothing more.
    assert (await node.repo.collect_garbage(grace_s=0)).delete == ()


async def test_gc_keeps_recent_blobs_of_a_commit_in_flight(
    tmp_path: Path, location: Location
) -> None:
    node = await new_node(tmp_path / "a", location)
    # A writer on another node has put its blobs and not yet its manifest (or crashed there).
    stray = tmp_path / "stray"
    stray.write_bytes(b"half a commit" * 1000)
    ref, _ = await node.repo.cache.adopt(stray)
    await node.store.put_file(blob_key(ref.digest), node.repo.cache.path(ref.digest))
    assert (await node.repo.collect_garbage(grace_s=3600)).delete == ()
    assert ref.digest in await blob_digests(node.store)
    # Once older than the grace, it is a crashed writer's leftover: reclaimed.
    plan = await node.repo.collect_garbage(grace_s=0)
    assert blob_key(ref.digest) in plan.delete
    assert ref.digest not in await blob_digests(node.store)


async def test_commits_and_gc_at_once_lose_nothing(tmp_path: Path, location: Location) -> None:
    node = await new_node(tmp_path / "a", location)
    other = await new_node(tmp_path / "b", location, bundle="envd 2", with_layers=False)

    async def commits() -> None:
        for i in range(6):
            await commit(node, f"s{i}")
            if i % 2:
                await node.repo.delete(f"s{i - 1}")

    async def passes() -> None:
        for _ in range(6):
            await node.repo.collect_garbage(grace_s=0)
            # A GC on another node too: it does not share this node's gate, so only its grace
            # keeps it off blobs a commit here has put and not yet named.
            await other.repo.collect_garbage(grace_s=60)
            await asyncio.sleep(0)

    await asyncio.gather(commits(), passes())
    assert await _missing(node) == {}
    assert sorted(s.snapshot_id for s in node.repo.list()) == ["s1", "s3", "s5"]
    # What is left materializes on a node that has nothing.
    fresh = await new_node(tmp_path / "c", location, with_layers=False)
    for snapshot in fresh.repo.list():
        local = await fresh.repo.materialize(snapshot, fresh.bundle)
        assert local.image is not None
        assert (local.image / "pages.img").read_bytes() == node.images[snapshot.snapshot_id][
            "pages.img"]


async def test_a_blob_deleted_by_another_nodes_gc_mid_commit_is_put_back(
    tmp_path: Path, location: Location
) -> None:
    node = await new_node(tmp_path / "a", location)
    first = await commit(node, "first")
    await node.repo.delete("first")
    layer_blob = next(b for b in first.manifest.layers if b.layer_id == BASE)
    # Another node's GC deletes the (now unreferenced) base layer blob just after this node's
    # commit found it present and skipped it.
    original = node.store.put_bytes

    async def put_then_gc_elsewhere(key: str, data: bytes, *, create: bool = False) -> None:
        if key.startswith("manifests/second"):
            await node.store.delete(blob_key(layer_blob.digest))
        await original(key, data, create=create)

    node.store.put_bytes = put_then_gc_elsewhere  # type: ignore[method-assign]
    await commit(node, "second")
    assert layer_blob.digest in await blob_digests(node.store)
    assert await _missing(node) == {}


async def test_missing_names_exactly_the_keys_the_store_lacks(
    tmp_path: Path, location: Location
) -> None:
    node = await new_node(tmp_path / "a", location)
    await node.store.put_bytes("blobs/sha256/present", b"1")
    keys = ["blobs/sha256/present", "blobs/sha256/absent", "manifests/absent.json"]
    assert await node.store.missing(keys) == {"blobs/sha256/absent", "manifests/absent.json"}
    assert await node.store.missing([]) == set()
