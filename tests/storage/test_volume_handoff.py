"""A volume between two nodes sharing one repository (real ext4 images, loop mounts and the
posix object store; no sandboxes): one node holds it at a time, releases it after its idle
delay with its data committed, and the other node then reads exactly that data. Names are
claimed once across both; a delete by one is seen by the other."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aenv.core.errors import Conflict, InvalidArgument
from aenv.core.settings import Settings
from aenv.orchestrator.volumes import MountRequest, Volumes
from aenv.storage.objects import ObjectStore, PosixLocation
from aenv.storage.volume_catalog import VolumeCatalog
from aenv.storage.volume_images import VolumeImages

pytestmark = pytest.mark.anyio


def _node(tmp_path: Path, name: str) -> Volumes:
    home = tmp_path / name
    home.mkdir()
    settings = Settings(home=home, volume_idle_release_s=0, volume_default_size_mb=64)
    store = ObjectStore(PosixLocation(kind="posix_fs", root=tmp_path / "repository"))
    return Volumes(settings, VolumeCatalog(store), VolumeImages(home), name)


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[tuple[Volumes, Volumes]]:
    a, b = _node(tmp_path, "a"), _node(tmp_path, "b")
    try:
        yield a, b
    finally:
        for node in (a, b):
            for volume_id in [p.name for p in node.images.mounts.glob("*")]:
                await node.images.unmount(volume_id)


async def test_one_node_at_a_time_and_the_next_reads_what_the_first_wrote(
    nodes: tuple[Volumes, Volumes],
) -> None:
    a, b = nodes
    vol = await a.create("shared")
    with pytest.raises(InvalidArgument, match="already exists"):  # E2B's 400
        await b.create("shared")
    payload = secrets.token_bytes(9 << 20)  # three chunks, the last one partial

    # Node a: a sandbox mounts it read-write and writes.
    [mounted] = await a.attach("sbx-a", [MountRequest("shared", "/data")])
    root = a.images.mount_point(vol.volume_id)
    (root / "sub").mkdir()
    (root / "sub" / "blob").write_bytes(payload)
    # While a holds it, b can neither mount nor serve it.
    with pytest.raises(Conflict, match="in use on node a"):
        await b.attach("sbx-b", [MountRequest("shared", "/data", read_only=True)])
    with pytest.raises(Conflict, match="in use on node a"):
        async with b.content(vol.volume_id, write=False):
            pass
    # A sandbox that is a user keeps it: no release.
    await a.release_idle()
    assert await a.catalog.holder(vol.volume_id) == "a"

    await a.detach("sbx-a")
    await a.release_idle()
    assert await a.catalog.holder(vol.volume_id) is None
    assert not a.images.has_image(vol.volume_id) and not a.images.mounted(vol.volume_id)
    committed = await a.catalog.require(vol.volume_id)
    assert committed.version == 1 and committed.chunks

    # Node b fetches the committed image.
    async with b.content(vol.volume_id, write=False) as there:
        got = (there / "sub" / "blob").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    assert await b.catalog.holder(vol.volume_id) == "b"
    # b writes, releases; a sees it.
    async with b.content(vol.volume_id, write=True) as there:
        (there / "sub" / "blob").write_bytes(b"rewritten")
    await b.release_idle()
    async with a.content(vol.volume_id, write=False) as there:
        assert (there / "sub" / "blob").read_bytes() == b"rewritten"
    await a.release_idle()
    # Chunks only the first version named are gone from the repository.
    listed = await a.catalog.store.list(f"volume-chunks/{vol.volume_id}/")
    assert {i.key.rsplit("/", 1)[1] for i in listed} == {
        c.digest.removeprefix("sha256:") for c in (await a.catalog.require(vol.volume_id)).chunks}
    assert mounted.volume_id == vol.volume_id


async def test_a_holder_that_restarts_takes_its_hold_back_and_delete_is_seen_everywhere(
    tmp_path: Path, nodes: tuple[Volumes, Volumes],
) -> None:
    a, b = nodes
    vol = await a.create("kept")
    async with a.content(vol.volume_id, write=True) as root:
        (root / "f").write_text("before the restart")
    # The process of node a dies (its in-memory users are gone; its hold and image stay).
    again = _node_again(tmp_path, "a")
    async with again.content(vol.volume_id, write=False) as root:
        assert (root / "f").read_text() == "before the restart"
    # A volume mounted by a sandbox is not deleted.
    await again.attach("sbx", [MountRequest("kept", "/k")])
    with pytest.raises(Conflict, match="mounted by sandbox sbx"):
        await again.delete(vol.volume_id)
    await again.detach("sbx")
    await again.delete(vol.volume_id)
    assert await b.catalog.get(vol.volume_id) is None
    assert [v.name for v in await b.list()] == []
    assert (await b.create("kept")).name == "kept"


def _node_again(tmp_path: Path, name: str) -> Volumes:
    home = tmp_path / name
    settings = Settings(home=home, volume_idle_release_s=0, volume_default_size_mb=64)
    store = ObjectStore(PosixLocation(kind="posix_fs", root=tmp_path / "repository"))
    return Volumes(settings, VolumeCatalog(store), VolumeImages(home), name)
