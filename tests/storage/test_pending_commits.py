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
from aenv.storage.objects import PosixLocation
from aenv.storage.repository import SnapshotRepository
from tests.storage.conftest import needs_root
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
