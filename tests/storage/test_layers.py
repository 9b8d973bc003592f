"""The layer store: ids, atomic commit, idempotency, crash leftovers, removal."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from aenv.core import proc
from aenv.core.errors import FailedPrecondition, InvalidArgument, NotFound
from aenv.storage.layers import LayerStore, check_layer_id, layer_id_for
from tests.storage.conftest import files_in, make_tree, mounts_under, needs_root

pytestmark = pytest.mark.anyio

ID_A = layer_id_for({"test": "a"})
ID_B = layer_id_for({"test": "b"})


def test_layer_id_is_canonical_sha256_of_the_recipe() -> None:
    one = layer_id_for({"suite": "bookworm", "packages": ["git", "curl"]})
    two = layer_id_for({"packages": ["git", "curl"], "suite": "bookworm"})
    assert one == two and len(one) == 64 and int(one, 16) >= 0
    assert layer_id_for({"suite": "bookworm", "packages": ["curl", "git"]}) != one


@pytest.mark.parametrize("bad", ["", "../etc", "A" * 64, "a" * 63, "a" * 64 + "/x", "g" * 64])
def test_malformed_ids_never_become_paths(tmp_path: Path, bad: str) -> None:
    store = LayerStore(tmp_path)
    with pytest.raises(InvalidArgument):
        check_layer_id(bad)
    with pytest.raises(InvalidArgument):
        store.path(bad)


async def test_commit_is_a_rename_with_metadata(layers: LayerStore) -> None:
    assert not layers.has(ID_A) and layers.list() == []
    async with layers.staging(ID_A) as staging:
        assert staging.is_dir() and not any(staging.iterdir())
        assert (staging.stat().st_mode & 0o777) == 0o755
        make_tree(staging, {"etc/hostname": "a\n", "bin/tool": "x" * 10000})
        layer = await layers.put_from_dir(staging, ID_A, recipe={"test": "a"})
        assert not staging.exists()
    assert layer.path == layers.root / ID_A and layers.has(ID_A)
    assert (layer.path / "etc/hostname").read_text() == "a\n"
    meta = json.loads((layers.root / f"{ID_A}.json").read_text())
    assert meta["recipe"] == {"test": "a"} and meta["size_bytes"] >= 10000
    assert meta["inodes"] == 5  # root, etc, bin and two files
    got = layers.get(ID_A)
    assert got.meta == layer.meta
    assert [x.layer_id for x in layers.list()] == [ID_A]
    # Nothing but the layer and its metadata is visible; staging is empty again.
    assert sorted(p.name for p in layers.root.iterdir() if not p.name.startswith(".")) == [
        ID_A,
        f"{ID_A}.json",
    ]
    assert list((layers.root / ".staging").iterdir()) == []


async def test_committing_an_existing_id_is_a_no_op(layers: LayerStore) -> None:
    async with layers.staging(ID_A) as staging:
        make_tree(staging, {"first": "1"})
        first = await layers.put_from_dir(staging, ID_A)
    async with layers.staging(ID_A) as staging:
        make_tree(staging, {"second": "2"})
        second = await layers.put_from_dir(staging, ID_A)
        assert not staging.exists()  # the loser's tree is discarded
    assert second.path == first.path and second.meta == first.meta
    assert files_in(first.path) == {"first"}


async def test_concurrent_commits_of_one_id_yield_one_layer(layers: LayerStore) -> None:
    async def build(tag: str) -> Path:
        async with layers.staging(ID_A) as staging:
            make_tree(staging, {"same": "content"})
            await asyncio.sleep(0)
            return (await layers.put_from_dir(staging, ID_A)).path

    paths = await asyncio.gather(*(build(str(i)) for i in range(5)))
    assert set(paths) == {layers.root / ID_A}
    assert files_in(layers.root / ID_A) == {"same"}
    assert list((layers.root / ".staging").iterdir()) == []


async def test_a_failed_build_leaves_nothing(layers: LayerStore) -> None:
    with pytest.raises(ZeroDivisionError):
        async with layers.staging(ID_A) as staging:
            make_tree(staging, {"half": "written"})
            raise ZeroDivisionError
    assert not layers.has(ID_A) and layers.list() == []
    assert list((layers.root / ".staging").iterdir()) == []


async def test_a_crashed_builder_leaves_only_staging_which_the_next_build_sweeps(
    layers: LayerStore,
) -> None:
    # A real process that dies (os._exit) in the middle of filling its staging directory.
    child = f"""
import asyncio, os, sys
sys.path[:0] = {sys.path!r}
from aenv.storage.layers import LayerStore
async def main():
    store = LayerStore({str(layers.root)!r})
    async with store.staging({ID_A!r}) as staging:
        (staging / "partial").write_text("x")
        os._exit(9)
asyncio.run(main())
"""
    done = await proc.run([sys.executable, "-c", child], check=False, timeout=60)
    assert done.returncode == 9, done.stderr
    leftovers = list((layers.root / ".staging").iterdir())
    assert len(leftovers) == 1 and not layers.has(ID_A) and layers.list() == []

    async with layers.staging(ID_B) as live:
        # A build in progress (its flock is held) survives the sweep; the dead one does not.
        assert await layers.clean_staging() == 1
        assert live.is_dir() and not leftovers[0].exists()
        make_tree(live, {"ok": "1"})
        await layers.put_from_dir(live, ID_B)
    assert [x.layer_id for x in layers.list()] == [ID_B]


async def test_remove_is_atomic_and_idempotent(layers: LayerStore) -> None:
    async with layers.staging(ID_A) as staging:
        make_tree(staging, {"a/b/c": "1", "d": "2"})
        await layers.put_from_dir(staging, ID_A)
    assert await layers.remove(ID_A) is True
    assert not layers.has(ID_A) and not (layers.root / f"{ID_A}.json").exists()
    assert list((layers.root / ".trash").iterdir()) == []
    assert await layers.remove(ID_A) is False
    with pytest.raises(NotFound):
        layers.get(ID_A)


async def test_put_needs_an_existing_staging_dir(layers: LayerStore, tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition):
        await layers.put_from_dir(tmp_path / "missing", ID_A)
    assert not layers.has(ID_A)


async def test_lost_metadata_does_not_lose_the_layer(layers: LayerStore) -> None:
    async with layers.staging(ID_A) as staging:
        make_tree(staging, {"f": "1"})
        await layers.put_from_dir(staging, ID_A, recipe={"x": 1})
    (layers.root / f"{ID_A}.json").unlink()
    layer = layers.get(ID_A)
    assert layer.meta.size_bytes is None and layer.meta.recipe is None
    assert [x.layer_id for x in layers.list()] == [ID_A]


async def _crashed_staging(layers: LayerStore, layer_id: str) -> Path:
    """A staging directory whose builder process died (as ``os._exit`` / SIGKILL leave it)."""
    child = f"""
import asyncio, os
from aenv.storage.layers import LayerStore
async def main():
    async with LayerStore({str(layers.root)!r}).staging({layer_id!r}) as staging:
        (staging / "proc").mkdir()
        os._exit(9)
asyncio.run(main())
"""
    done = await proc.run([sys.executable, "-c", child], check=False, timeout=60)
    assert done.returncode == 9, done.stderr
    [leftover] = (layers.root / ".staging").iterdir()
    return leftover


@needs_root
async def test_sweeping_detaches_mounts_a_killed_builder_left(
    layers: LayerStore, tmp_path: Path
) -> None:
    # mmdebstrap mounts /proc, /sys, /dev/pts into its chroot; killed, it leaves them there.
    # Deleting the leftover must not delete through such a mount into another filesystem.
    victim = make_tree(tmp_path / "victim", {"precious": "1"})
    leftover = await _crashed_staging(layers, ID_A)
    await proc.run(["mount", "--bind", str(victim), str(leftover / "proc")])
    assert await layers.clean_staging() == 1
    assert not leftover.exists() and (victim / "precious").read_text() == "1"
    assert mounts_under(layers.root) == []


@needs_root
async def test_remove_never_deletes_through_a_mount(layers: LayerStore, tmp_path: Path) -> None:
    victim = make_tree(tmp_path / "victim", {"precious": "1"})
    async with layers.staging(ID_A) as staging:
        make_tree(staging, {"mnt/keep": ""})
        layer = await layers.put_from_dir(staging, ID_A)
    await proc.run(["mount", "--bind", str(victim), str(layer.path / "mnt")])
    with pytest.raises(FailedPrecondition, match="mounted inside"):
        await layers.remove(ID_A)
    assert not layers.has(ID_A)  # gone from view at once; the tree waits in .trash
    assert (victim / "precious").read_text() == "1"
    assert await layers.clean_staging() == 1
    assert (victim / "precious").read_text() == "1" and mounts_under(layers.root) == []
