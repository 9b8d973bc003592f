"""The snapshot repository (posix_fs): atomic commit, crash leftovers, index, lookup, deletion."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from aenv.core.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from aenv.storage.repository import (
    IMAGE_FILES,
    Snapshot,
    SnapshotManifest,
    SnapshotRepository,
    Staged,
)

pytestmark = pytest.mark.anyio


def new_repo(home: Path) -> SnapshotRepository:
    repo = SnapshotRepository(home / "repository", home / "staging")
    repo.start()
    return repo


@pytest.fixture
def repo(tmp_path: Path) -> SnapshotRepository:
    return new_repo(tmp_path)


def manifest(snapshot_id: str, **fields: Any) -> SnapshotManifest:
    base: dict[str, Any] = {
        "snapshot_id": snapshot_id,
        "template_id": "base",
        "created_at": 1000.0,
        "layers": ["/home/aenv/layers/aaa", "/home/aenv/layers/bbb"],
        "envd_bundle": "/home/aenv/envd/bundle-1",
        "cpu_count": 2,
        "memory_mb": 512,
    }
    base.update(fields)
    return SnapshotManifest(**base)


def write_image(staged: Staged, files: tuple[str, ...] = IMAGE_FILES) -> None:
    """What a runsc checkpoint leaves behind, minus the content."""
    staged.memory_dir.mkdir()
    for name in files:
        (staged.memory_dir / name).write_bytes(name.encode() * 10)


async def commit(repo: SnapshotRepository, snapshot_id: str, **fields: Any) -> Snapshot:
    staged = repo.stage(snapshot_id)
    write_image(staged)
    return await repo.commit(staged, manifest(snapshot_id, **fields))


def visible(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "repository" / "snapshots").iterdir())


async def test_commit_makes_the_snapshot_visible_with_every_field(
    repo: SnapshotRepository, tmp_path: Path
) -> None:
    full = manifest(
        "snap-1",
        names=["mine", "other"],
        kind="template",
        source_sandbox_id="sbx1",
        default_user="root",
        default_workdir="/work",
        env_vars={"A": "1"},
        metadata={"team": "x"},
        memory_size_bytes=12345,
        envd_token="s3cret",
    )
    staged = repo.stage("snap-1")
    assert staged.path.parent == tmp_path / "staging" and staged.path.is_dir()
    assert not staged.memory_dir.exists()  # the checkpoint creates it
    assert repo.get("snap-1") is None
    write_image(staged)

    snap = await repo.commit(staged, full)

    assert snap.snapshot_id == "snap-1" and snap.manifest == full
    assert snap.manifest.envd_token == "s3cret" and "s3cret" not in repr(snap)
    assert snap.path == tmp_path / "repository" / "snapshots" / "snap-1"
    assert sorted(p.name for p in snap.memory_dir.iterdir()) == sorted(IMAGE_FILES)
    assert not staged.path.exists()
    assert repo.get("snap-1") == snap and repo.require("snap-1") == snap
    # What is on disk round-trips, field for field, through a fresh repository object.
    again = new_repo(tmp_path).require("snap-1")
    assert again.manifest == full and again.manifest.model_dump() == full.model_dump()
    assert again.path == snap.path


async def test_staged_but_uncommitted_is_invisible_and_swept_by_start(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    staged = repo.stage("snap-1")
    write_image(staged)
    assert repo.get("snap-1") is None and repo.list(kind=None) == []

    # The process dies here; the next one starts on the same directories.
    repo2 = SnapshotRepository(tmp_path / "repository", tmp_path / "staging")
    removed = repo2.start()
    assert removed == [str(staged.path)]
    assert not staged.path.exists() and list((tmp_path / "staging").iterdir()) == []
    assert repo2.get("snap-1") is None and visible(tmp_path) == []


async def test_crash_between_manifest_and_rename_leaves_nothing(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    staged = repo.stage("snap-1")
    write_image(staged)
    (staged.path / "manifest.json").write_text(manifest("snap-1").model_dump_json())
    # ...and the process dies before the rename.
    assert repo.get("snap-1") is None

    repo2 = SnapshotRepository(tmp_path / "repository", tmp_path / "staging")
    assert repo2.start() == [str(staged.path)]
    assert repo2.get("snap-1") is None and repo2.find("snap-1") is None
    assert visible(tmp_path) == []


@pytest.mark.parametrize("present", [(), ("checkpoint.img", "pages.img"), None])
async def test_commit_without_a_complete_image_fails(
    repo: SnapshotRepository, tmp_path: Path, present: tuple[str, ...] | None
) -> None:
    staged = repo.stage("snap-1")
    if present is not None:  # None: not even the memory directory
        write_image(staged, present)
    with pytest.raises(FailedPrecondition, match="memory image incomplete"):
        await repo.commit(staged, manifest("snap-1"))
    assert repo.get("snap-1") is None and visible(tmp_path) == []
    assert new_repo(tmp_path).get("snap-1") is None
    await repo.discard(staged)
    assert not staged.path.exists()
    await repo.discard(staged)  # idempotent


async def test_duplicate_id_is_already_exists(repo: SnapshotRepository, tmp_path: Path) -> None:
    first = await commit(repo, "snap-1", created_at=1.0)
    staged = repo.stage("snap-1")
    write_image(staged)
    with pytest.raises(AlreadyExists):
        await repo.commit(staged, manifest("snap-1", created_at=2.0))
    assert repo.require("snap-1") == first
    assert new_repo(tmp_path).require("snap-1").manifest.created_at == 1.0
    await repo.discard(staged)


async def test_commit_rejects_a_mismatched_manifest_or_foreign_path(
    repo: SnapshotRepository, tmp_path: Path
) -> None:
    staged = repo.stage("snap-1")
    write_image(staged)
    with pytest.raises(InvalidArgument):
        await repo.commit(staged, manifest("snap-2"))
    foreign = Staged("snap-1", tmp_path / "elsewhere")
    foreign.path.mkdir()
    with pytest.raises(InvalidArgument):
        await repo.commit(foreign, manifest("snap-1"))
    with pytest.raises(InvalidArgument):
        await repo.discard(foreign)
    assert foreign.path.is_dir()  # never deleted
    assert visible(tmp_path) == []


async def test_list_filters_and_orders_newest_first(repo: SnapshotRepository) -> None:
    await commit(repo, "a", created_at=10.0, source_sandbox_id="sbx1", names=["n"])
    await commit(repo, "b", created_at=30.0, source_sandbox_id="sbx2", names=["n", "m"])
    await commit(repo, "c", created_at=20.0, source_sandbox_id="sbx1")
    await commit(repo, "d", created_at=20.0, source_sandbox_id="sbx1")  # ties: id descending
    await commit(repo, "t", created_at=40.0, kind="template", names=["n"])

    def ids(snaps: list[Snapshot]) -> list[str]:
        return [s.snapshot_id for s in snaps]

    assert ids(repo.list()) == ["b", "d", "c", "a"]
    assert ids(repo.list(kind=None)) == ["t", "b", "d", "c", "a"]
    assert ids(repo.list(kind="template")) == ["t"]
    assert ids(repo.list(sandbox_id="sbx1")) == ["d", "c", "a"]
    assert ids(repo.list(sandbox_id="nope")) == []
    assert ids(repo.list(name="n")) == ["b", "a"]
    assert ids(repo.list(name="n", kind=None)) == ["t", "b", "a"]
    assert ids(repo.list(name="n", sandbox_id="sbx1")) == ["a"]
    assert ids(repo.list(name="m")) == ["b"]


async def test_find_by_id_else_newest_with_the_name(repo: SnapshotRepository) -> None:
    await commit(repo, "old", created_at=1.0, names=["prod"])
    await commit(repo, "new", created_at=2.0, names=["prod"])
    await commit(repo, "prod-id", created_at=0.5, names=["x"])
    await commit(repo, "shadow", created_at=3.0, names=["prod-id"])

    found = repo.find("prod")
    assert found is not None and found.snapshot_id == "new"
    found = repo.find("old")
    assert found is not None and found.snapshot_id == "old"
    found = repo.find("prod-id")  # an id wins over a newer snapshot carrying it as a name
    assert found is not None and found.snapshot_id == "prod-id"
    assert repo.find("nothing") is None
    assert repo.find("../etc") is None
    await repo.delete("new")
    found = repo.find("prod")
    assert found is not None and found.snapshot_id == "old"


async def test_delete(repo: SnapshotRepository, tmp_path: Path) -> None:
    snap = await commit(repo, "snap-1")
    keep = await commit(repo, "snap-2")
    await repo.delete("snap-1")
    assert repo.get("snap-1") is None and not snap.path.exists()
    assert visible(tmp_path) == ["snap-2"]
    assert list((tmp_path / "repository" / "trash").iterdir()) == []
    assert new_repo(tmp_path).get("snap-1") is None
    with pytest.raises(NotFound, match="snapshot snap-1 not found"):
        await repo.delete("snap-1")
    with pytest.raises(NotFound):
        await repo.delete("unknown")
    with pytest.raises(NotFound):
        repo.require("snap-1")
    assert repo.require("snap-2") == keep
    # The id is free again.
    again = await commit(repo, "snap-1", created_at=5.0)
    assert repo.require("snap-1") == again


async def test_leftover_trash_is_removed_by_start(tmp_path: Path) -> None:
    repo = new_repo(tmp_path)
    snap = await commit(repo, "snap-1")
    # A crash mid-delete: renamed into the trash, files not yet removed.
    doomed = tmp_path / "repository" / "trash" / "snap-1.0123456789ab"
    snap.path.rename(doomed)

    repo2 = SnapshotRepository(tmp_path / "repository", tmp_path / "staging")
    assert repo2.start() == [str(doomed)]
    assert not doomed.exists() and repo2.get("snap-1") is None


@pytest.mark.parametrize(
    "bad", ["", "../x", "..", ".", ".hidden", "a/b", "a" * 65, "a b", "é", "a\x00b", "/abs"]
)
async def test_bad_ids_never_become_paths(repo: SnapshotRepository, bad: str) -> None:
    with pytest.raises(InvalidArgument):
        repo.stage(bad)
    with pytest.raises(InvalidArgument):
        await repo.commit(Staged(bad, repo.staging / f"{bad}.x"), manifest(bad))
    assert repo.get(bad) is None and repo.find(bad) is None
    with pytest.raises(NotFound):
        repo.require(bad)
    with pytest.raises(NotFound):
        await repo.delete(bad)


@pytest.mark.parametrize("good", ["a", "a" * 64, "A.b_c-9", "-x", "_", "snap.."])
async def test_good_ids(repo: SnapshotRepository, good: str) -> None:
    snap = await commit(repo, good)
    assert repo.require(good) == snap


async def test_a_corrupt_manifest_is_skipped_not_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = new_repo(tmp_path)
    await commit(repo, "good")
    bad = await commit(repo, "bad")
    (bad.path / "manifest.json").write_text("{not json")
    wrong = await commit(repo, "wrong")
    (wrong.path / "manifest.json").write_text(manifest("other").model_dump_json())
    extra = await commit(repo, "extra")
    data = extra.manifest.model_dump_json()[:-1] + ', "surprise": 1}'
    (extra.path / "manifest.json").write_text(data)

    repo2 = SnapshotRepository(tmp_path / "repository", tmp_path / "staging")
    with caplog.at_level(logging.ERROR, logger="aenv.storage.repository"):
        assert repo2.start() == []
    assert [s.snapshot_id for s in repo2.list()] == ["good"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert all(f"snapshots/{name}:" in logged for name in ("bad", "wrong", "extra"))
    assert visible(tmp_path) == ["bad", "extra", "good", "wrong"]  # nothing deleted
    # The id stays taken by the unreadable snapshot.
    staged = repo2.stage("bad")
    write_image(staged)
    with pytest.raises(AlreadyExists):
        await repo2.commit(staged, manifest("bad"))


async def test_referenced_paths(repo: SnapshotRepository) -> None:
    assert repo.referenced_paths() == set()
    await commit(repo, "a", layers=["/l/1", "/l/2"], envd_bundle="/e/1")
    await commit(repo, "b", layers=["/l/2", "/l/3"], envd_bundle="/e/2", kind="template")
    assert repo.referenced_paths() == {Path(p) for p in ["/l/1", "/l/2", "/l/3", "/e/1", "/e/2"]}
    await repo.delete("a")
    assert repo.referenced_paths() == {Path(p) for p in ["/l/2", "/l/3", "/e/2"]}


def test_manifest_is_strict_and_frozen() -> None:
    m = manifest("a")
    assert m.format == 1 and m.names == [] and m.kind == "snapshot"
    with pytest.raises(ValueError, match="surprise"):
        SnapshotManifest.model_validate({**m.model_dump(), "surprise": 1})
    with pytest.raises(ValueError, match="kind"):
        manifest("a", kind="other")
    with pytest.raises(ValueError, match="frozen"):
        m.cpu_count = 4


async def test_staging_is_private_and_commit_is_durable_layout(
    repo: SnapshotRepository,
) -> None:
    staged = repo.stage("snap-1")
    assert staged.path.stat().st_mode & 0o777 == 0o700
    assert staged.path.name.startswith("snap-1.")
    assert repo.stage("snap-1").path != staged.path  # stage twice: two private directories
    write_image(staged)
    snap = await repo.commit(staged, manifest("snap-1"))
    assert (snap.path / "manifest.json").stat().st_mode & 0o777 == 0o600
    assert SnapshotManifest.model_validate_json((snap.path / "manifest.json").read_bytes()) == (
        snap.manifest
    )


async def test_concurrent_commits_of_one_id_one_wins(repo: SnapshotRepository) -> None:
    staged = [repo.stage("snap-1") for _ in range(2)]
    for s in staged:
        write_image(s)
    results = await asyncio.gather(
        *(repo.commit(s, manifest("snap-1", created_at=i)) for i, s in enumerate(staged)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Snapshot) for r in results) == 1
    assert sum(isinstance(r, AlreadyExists) for r in results) == 1
    winner = next(r for r in results if isinstance(r, Snapshot))
    assert repo.require("snap-1") == winner


async def test_commit_after_discard_fails(repo: SnapshotRepository, tmp_path: Path) -> None:
    staged = repo.stage("snap-1")
    write_image(staged)
    await repo.discard(staged)
    with pytest.raises(FailedPrecondition):
        await repo.commit(staged, manifest("snap-1"))
    assert repo.get("snap-1") is None and visible(tmp_path) == []
