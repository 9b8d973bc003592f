"""Commits after the answer (``storage/pending_commits.py``): a snapshot whose order is
written is found by every read on its node at once, survives a crash before its commit, and
a commit that fails is tried again (reads answer 503 meanwhile, never a missing snapshot)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aenv.core.errors import Unavailable
from aenv.storage import pending_commits
from aenv.storage.disk_exports import DiskExportOrder
from aenv.storage.objects import PosixLocation
from aenv.storage.repository import SnapshotRepository
from tests.storage.conftest import needs_root
from tests.storage.disk_files import chunk_digests, clone_file
from tests.storage.test_repository import (
    BASE,
    TOP,
    Crash,
    Node,
    draft,
    manifest_ids,
    new_node,
    write_image,
)

pytestmark = [pytest.mark.anyio, needs_root]


@pytest.fixture
async def node(tmp_path: Path) -> Node:
    return await new_node(tmp_path / "a", PosixLocation(kind="posix_fs", root=tmp_path / "repo"))


async def _answer(node: Node, snapshot_id: str, **fields: object) -> dict[str, bytes]:
    staged = node.repo.stage(snapshot_id)
    image = write_image(staged)
    answered = await node.repo.commit_later(
        staged, draft(snapshot_id, **fields), layers=[node.layer(BASE), node.layer(TOP)],
        envd_bundle=node.bundle)
    assert answered.snapshot_id == snapshot_id
    return image


async def test_reads_wait_for_the_commit_behind_the_answer(node: Node) -> None:
    image = await _answer(node, "snap-1", names=["named"])
    assert node.repo.pending("snap-1")
    # By name and by id, the moment after the answer.
    found = await node.repo.lookup("named")
    assert found is not None and found.snapshot_id == "snap-1"
    assert not node.repo.pending("snap-1")
    assert await manifest_ids(node.store) == ["snap-1"]
    assert os.listdir(node.repo.staging) == []
    local = node.repo.images / "snap-1"
    assert {p.name: p.read_bytes() for p in local.iterdir()} == image
    await _answer(node, "snap-2")
    await node.repo.settle()  # what a listing does first
    assert [s.snapshot_id for s in node.repo.list()] == ["snap-2", "snap-1"]
    await node.repo.close()


async def test_an_answered_snapshot_is_committed_by_the_next_start(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(key: str) -> None:
        raise Crash(key)

    node.store.before_put = crash  # its commit cannot get anywhere...
    await _answer(node, "snap-1")
    await asyncio.sleep(0.2)
    assert await manifest_ids(node.store) == [] and node.repo.pending("snap-1")
    monkeypatch.setattr(pending_commits, "CLOSE_S", 0.0)
    await node.repo.close()  # ...and the process stops: the commit is cut short
    assert not node.repo.pending("snap-1")
    node.store.before_put = None
    # The next process on the same home: the order beside the image is the promise.
    again = SnapshotRepository(node.store, node.repo.artifacts, node.repo.staging,
                               node.repo.images)
    assert await again.start() == []
    assert (await again.require("snap-1")).snapshot_id == "snap-1"
    assert await manifest_ids(node.store) == ["snap-1"]
    assert os.listdir(node.repo.staging) == []
    # A staging directory without an order (no answer was given) is still swept.
    unanswered = again.stage("snap-2")
    write_image(unanswered)
    third = SnapshotRepository(node.store, node.repo.artifacts, node.repo.staging,
                               node.repo.images)
    assert await third.start() == [str(unanswered.path)]
    await third.close()
    await again.close()


async def test_a_failed_commit_answers_503_then_is_tried_again(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pending_commits, "RETRY_S", 0.3)
    failures = []

    def down(key: str) -> None:
        if len(failures) < 2:
            failures.append(key)
            raise Unavailable("the store is down")

    node.store.before_put = down
    await _answer(node, "snap-1")
    with pytest.raises(Unavailable, match="tried again"):
        await node.repo.lookup("snap-1")
    for _ in range(50):
        if not node.repo.pending("snap-1"):
            break
        await asyncio.sleep(0.1)
    assert (await node.repo.require("snap-1")).snapshot_id == "snap-1"
    assert len(failures) == 2
    await node.repo.close()


async def test_an_incomplete_image_is_dropped_not_retried(node: Node) -> None:
    staged = node.repo.stage("snap-1")
    staged.memory_dir.mkdir()  # no image files: the checkpoint never wrote them
    await node.repo.commit_later(staged, draft("snap-1"), layers=[node.layer(BASE)],
                                 envd_bundle=node.bundle)
    assert await node.repo.lookup("snap-1") is None
    assert not node.repo.pending("snap-1")
    await node.repo.close()


def _export(node: Node, clone: Path) -> DiskExportOrder:
    return DiskExportOrder(clone=str(clone), index_file=str(node.home / "s1.json"),
                           pin=str(node.home / "s1.last.img"), sandbox_id="s1",
                            snapshot_id="snap-1")


async def test_a_disk_is_exported_after_the_answer(node: Node) -> None:
    clone, data = clone_file(node.home, "clone.img")
    staged = node.repo.stage("snap-1")
    write_image(staged)
    await node.repo.commit_later(staged, draft("snap-1"), layers=[node.layer(BASE)],
                                 envd_bundle=node.bundle, disk_export=_export(node, clone))
    assert node.repo.pending("snap-1")
    found = await node.repo.require("snap-1")
    assert found.manifest.disk is not None
    assert [c.digest for c in found.manifest.disk.chunks] == chunk_digests(data)
    # The clone is the sandbox's previous export now, for the next one to compare with.
    assert not clone.exists() and (node.home / "s1.last.img").read_bytes() == data
    await node.repo.close()


async def test_an_export_done_before_a_crash_is_committed_not_done_again(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(key: str) -> None:
        raise Crash(key)

    clone, data = clone_file(node.home, "clone.img")
    node.store.before_put = crash  # the export runs, the commit cannot get anywhere...
    staged = node.repo.stage("snap-1")
    write_image(staged)
    await node.repo.commit_later(staged, draft("snap-1"), layers=[node.layer(BASE)],
                                 envd_bundle=node.bundle, disk_export=_export(node, clone))
    for _ in range(50):
        if not clone.exists():
            break
        await asyncio.sleep(0.1)
    assert not clone.exists(), "the export did not run"
    monkeypatch.setattr(pending_commits, "CLOSE_S", 0.0)
    await node.repo.close()  # ...and the process stops
    node.store.before_put = None
    again = SnapshotRepository(node.store, node.repo.artifacts, node.repo.staging,
                               node.repo.images)
    await again.start()
    # The clone is the pin now: the order written before that names the chunks.
    found = await again.require("snap-1")
    assert found.manifest.disk is not None
    assert [c.digest for c in found.manifest.disk.chunks] == chunk_digests(data)
    assert os.listdir(again.staging) == []
    await again.close()


async def test_a_pending_snapshot_is_usable_here_before_its_commit(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    held = asyncio.Event()

    async def slow_put(key: str, data: bytes, *, create: bool = False) -> None:
        await held.wait()
        await put(key, data, create=create)

    put = node.store.put_bytes
    monkeypatch.setattr(node.store, "put_bytes", slow_put)  # the commit cannot finish yet
    disks = node.home / "disks"
    disks.mkdir()
    clone, data = clone_file(node.home, "clone.img", chunks=1)
    (disks / "snap-1.img").write_bytes(data)  # the local clone the snapshot op keeps
    staged = node.repo.stage("snap-1")
    image = write_image(staged)
    await node.repo.commit_later(staged, draft("snap-1", names=["named"]),
                                 layers=[node.layer(BASE)], envd_bundle=node.bundle,
                                 disk_export=_export(node, clone))
    assert node.repo.pending_draft("named") is not None
    found = await asyncio.wait_for(node.repo.materialize_pending("named", disks), 5)
    assert found is not None and node.repo.pending("snap-1")
    answered, local = found
    assert answered.snapshot_id == "snap-1"
    assert local.image is not None and local.disk == disks / "snap-1.img"
    assert {p.name: p.read_bytes() for p in local.image.iterdir()} == image
    assert local.layers == (node.layer(BASE),) and local.envd_bundle == node.bundle
    # Not a disk node: the lookup's path answers (and waits), not this one.
    assert await node.repo.materialize_pending("named", None) is None
    held.set()
    committed = await node.repo.require("snap-1")
    assert await node.repo.materialize_pending("snap-1", disks) is None
    # The commit kept the image the create restored from, file for file.
    assert committed.manifest.memory
    assert {p.name: p.read_bytes() for p in local.image.iterdir()} == image
    await node.repo.close()


async def test_gc_keeps_a_pending_snapshots_image(node: Node,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pending_commits, "RETRY_S", 0.5)
    failures: list[str] = []

    def down(key: str) -> None:
        if not failures:
            failures.append(key)
            raise Unavailable("the store is down")

    node.store.before_put = down  # the first try fails: pending, between tries
    staged = node.repo.stage("snap-1")
    image = write_image(staged)
    await node.repo.commit_later(staged, draft("snap-1"), layers=[node.layer(BASE)],
                                 envd_bundle=node.bundle)
    found = await node.repo.materialize_pending("snap-1", None)
    assert found is not None and found[1].image is not None
    await asyncio.sleep(0.1)
    assert failures and node.repo.pending("snap-1")
    await node.repo.collect_garbage(grace_s=0)  # no manifest names it yet
    assert {p.name: p.read_bytes() for p in found[1].image.iterdir()} == image
    for _ in range(50):
        if not node.repo.pending("snap-1"):
            break
        await asyncio.sleep(0.1)
    assert (await node.repo.require("snap-1")).snapshot_id == "snap-1"
    await node.repo.close()


async def test_an_export_left_by_a_stop_waits_for_the_pool(node: Node) -> None:
    """A snapshot answered before a stop, its disk not exported yet: its clone is on the
    workspace pool, which a node mounts after the repository starts (after a reboot it is not
    mounted before). The commit starts only when the node says the pool is there."""
    clone, data = clone_file(node.home, "clone.img")
    staged = node.repo.stage("snap-1")
    write_image(staged)
    pending_commits.CommitOrder(
        draft=draft("snap-1"), layers=[str(node.layer(BASE))], envd_bundle=str(node.bundle),
        disk_export=_export(node, clone)).write(staged.path)
    away = node.home / "unmounted.img"
    clone.rename(away)  # the pool is not mounted yet
    again = SnapshotRepository(node.store, node.repo.artifacts, node.repo.staging,
                               node.repo.images)
    assert await again.start() == []
    await asyncio.sleep(0.3)
    assert not again.pending("snap-1") and await manifest_ids(node.store) == []
    away.rename(clone)  # mounted
    again.start_exports()
    found = await again.require("snap-1")
    assert found.manifest.disk is not None
    assert [c.digest for c in found.manifest.disk.chunks] == chunk_digests(data)
    await again.close()
