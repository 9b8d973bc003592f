"""Workspaces on real loop devices: a per-sandbox ext4 image in a loop-mounted XFS pool.

Each test gets its own aenv home under /tmp (ext4 on this host, so the pool is an XFS image).
The fixture fails the test if anything of it is still mounted or attached after the test's own
clean-up, then removes it by force, so a failing test never leaks loop devices.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from aenv.core import proc
from aenv.core.errors import (
    AlreadyExists,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotEnoughSpace,
)
from aenv.storage import loopdev
from aenv.storage.ext4_resize import has_cap_sys_resource
from aenv.storage.reflink_fs import NotReflinkable, ReflinkPool
from aenv.storage.workspaces import WorkspaceStore
from tests.storage.conftest import mounts_under
from tests.storage.workspace_pool import POOL_BYTES, dd, workspace_store

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="loop devices need root"),
    pytest.mark.skipif(shutil.which("mkfs.xfs") is None, reason="needs xfsprogs"),
]

def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


async def test_create_attach_write_detach_reattach_keeps_files(store: WorkspaceStore) -> None:
    ws = await store.create("sb1", 64)
    assert ws.image.stat().st_size == 64 << 20
    mnt = await store.attach("sb1")
    assert mnt == store.mount_point("sb1")
    assert (mnt / "upper").is_dir() and (mnt / "work").is_dir()
    assert (mnt / "upper").stat().st_mode & 0o777 == 0o755
    assert await store.attach("sb1") == mnt  # idempotent
    assert len(loopdev.loops_backed_by(ws.image)) == 1
    assert loopdev.loops_backed_by(ws.image)[0].autoclear
    assert loopdev.loops_backed_by(ws.image)[0].direct_io
    (mnt / "upper" / "hello").write_text("world")
    await store.detach("sb1")
    assert not store.is_attached("sb1") and not loopdev.loops_backed_by(ws.image)
    assert not mnt.exists()
    mnt = await store.attach("sb1")
    assert (mnt / "upper" / "hello").read_text() == "world"
    await store.detach("sb1")
    with pytest.raises(AlreadyExists):
        await store.create("sb1", 64)
    with pytest.raises(InvalidArgument):
        await store.create("sb2", 1)
    with pytest.raises(InvalidArgument):
        await store.create("../x", 64)


async def test_writing_past_the_disk_size_is_enospc_and_the_disk_stays_usable(
    store: WorkspaceStore,
) -> None:
    await store.create("full", 64)
    mnt = await store.attach("full")
    done = await dd(mnt / "upper" / "big", 100)
    assert done.returncode != 0
    assert b"No space left on device" in done.stderr
    written = (mnt / "upper" / "big").stat().st_size
    assert 50 << 20 < written < 64 << 20
    (mnt / "upper" / "big").unlink()
    assert (await dd(mnt / "upper" / "again", 8)).returncode == 0
    assert (mnt / "upper" / "again").stat().st_size == 8 << 20
    await store.detach("full")


async def test_clone_frozen_is_a_point_in_time_copy_sharing_blocks(
    store: WorkspaceStore, tmp_path: Path
) -> None:
    await store.create("src", 200)
    mnt = await store.attach("src")
    await dd(mnt / "upper" / "data", 100, "/dev/urandom")
    (mnt / "upper" / "marker").write_text("v1")  # dirty in the page cache: the freeze flushes it
    before = store.pool.free_bytes()
    child = await store.clone_frozen("src", "child")
    (store.pool.path / "snapshots").mkdir()  # the caller's directory on the pool filesystem
    snapshot = await store.clone_frozen("src", store.pool.path / "snapshots" / "snap.img")
    shared_cost = before - store.pool.free_bytes()
    assert shared_cost < 4 << 20, f"two clones of 100 MiB used {shared_cost} bytes"
    (mnt / "upper" / "marker").write_text("v2")
    (mnt / "upper" / "after").write_text("x")
    (mnt / "work" / "probe").write_text("writable again")  # thawed
    expected = _md5(mnt / "upper" / "data")

    assert child == store.image_path("child")
    cmnt = await store.attach("child")
    assert (cmnt / "upper" / "marker").read_text() == "v1"
    assert not (cmnt / "upper" / "after").exists()
    assert _md5(cmnt / "upper" / "data") == expected
    await store.create_from("fromsnap", snapshot)
    smnt = await store.attach("fromsnap")
    assert (smnt / "upper" / "marker").read_text() == "v1"
    # The copies diverge: writing one does not touch the other.
    (cmnt / "upper" / "marker").write_text("child")
    assert (mnt / "upper" / "marker").read_text() == "v2"
    for sandbox_id in ("src", "child", "fromsnap"):
        await store.detach(sandbox_id)
    with pytest.raises(AlreadyExists):
        await store.clone("src", "child")
    with pytest.raises(InvalidArgument):  # a snapshot's file must be on the pool's filesystem
        await store.clone("src", tmp_path / "elsewhere.img")
    assert not store.observe().staging


async def test_a_plain_clone_of_an_attached_workspace_is_refused(store: WorkspaceStore) -> None:
    await store.create("a", 64)
    await store.attach("a")
    with pytest.raises(FailedPrecondition, match="clone_frozen"):
        await store.clone("a", "b")
    await store.detach("a")
    await store.clone("a", "b")
    assert store.get("b").size_mb == 64


async def test_observe_finds_an_attached_workspace_after_a_crash(home: Path) -> None:
    first = await workspace_store(home)
    await first.create("crashy", 64)
    mnt = await first.attach("crashy")
    (mnt / "upper" / "f").write_text("kept")
    await proc.run(["fsfreeze", "--freeze", str(mnt)])  # a crash in the middle of clone_frozen
    device = first.pool.state.device
    del first  # the server died: only the kernel's state is left

    second = await workspace_store(home)
    assert second.pool.state.kind == "image" and second.pool.state.device == device
    seen = second.observe()
    assert set(seen.images) == {"crashy"}
    assert seen.mounted["crashy"] in seen.loops["crashy"]
    assert not seen.orphan_loops
    assert await second.attach("crashy") == mnt  # reuses the mount and thaws it
    (mnt / "upper" / "g").write_text("thawed")
    assert len(loopdev.loops_backed_by(second.image_path("crashy"))) == 1
    await second.detach("crashy")
    assert not second.observe().mounted and not second.observe().loops


async def test_a_loop_device_left_by_a_crash_before_mount_is_cleared(store: WorkspaceStore) -> None:
    ws = await store.create("half", 64)
    stale = await loopdev.attach(ws.image)  # the crash came between losetup and mount
    assert store.observe().loops == {"half": (stale,)}
    assert not loopdev.loops_backed_by(ws.image)[0].autoclear
    await store.attach("half")
    (now,) = loopdev.loops_backed_by(ws.image)  # the stale one was detached, not stacked
    assert now.autoclear and store.observe().mounted["half"] == now.device
    await store.detach("half")
    assert not loopdev.loops_backed_by(ws.image)


def _hold_in_own_mount_namespace(path: Path) -> subprocess.Popen[bytes]:
    """A process that keeps ``path`` open from a mount namespace of its own, as runsc's gofer
    keeps a sandbox's rootfs: the mount outlives its unmount here while the process lives,
    and goes a moment after it dies, from the kernel's own deferred work."""
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'exec 3>"{path}"; echo held >&3; exec sleep 600'])
    deadline = time.monotonic() + 10
    while not (path.exists() and path.read_text() == "held\n"):
        assert time.monotonic() < deadline, "the holder did not start"
        time.sleep(0.01)
    return holder


async def test_a_detach_ends_when_the_file_system_has_ended_not_at_its_unmount(
        store: WorkspaceStore) -> None:
    # The holder dies 0.3 s into the detach; the file system ends a moment later. A detach
    # that returned at its unmount left the device behind (after a killed holder: 50 of 50
    # times, for 10-30 ms on a quiet host, longer under load), and a resume attaching the
    # image again then mounted a second live ext4 on it: "Structure needs cleaning".
    ws = await store.create("held", 64)
    mnt = await store.attach("held")
    holder = _hold_in_own_mount_namespace(mnt / "upper" / "file")
    asyncio.get_running_loop().call_later(0.3, holder.kill)
    started = time.monotonic()
    await store.detach("held")
    assert time.monotonic() - started >= 0.3
    holder.wait()
    assert not loopdev.loops_backed_by(ws.image)
    mnt = await store.attach("held")
    assert (mnt / "upper" / "file").read_text() == "held\n"
    await store.detach("held")


async def test_an_image_whose_file_system_lives_on_is_not_attached_twice(
        store: WorkspaceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aenv.storage.workspace_mounts.RELEASE_TIMEOUT_S", 0.3)
    ws = await store.create("alive", 64)
    mnt = await store.attach("alive")
    holder = _hold_in_own_mount_namespace(mnt / "upper" / "held")
    try:
        with pytest.raises(Conflict, match="still in use by the kernel"):
            await store.detach("alive")
        assert not store.is_attached("alive")
        with pytest.raises(Conflict, match="still in use by the kernel"):
            await store.attach("alive")
        assert len(loopdev.loops_backed_by(ws.image)) == 1  # no second device
    finally:
        holder.kill()
        holder.wait()
    mnt = await store.attach("alive")
    assert (mnt / "upper" / "held").read_text() == "held\n"
    await store.detach("alive")


async def test_detach_and_remove_are_idempotent(store: WorkspaceStore) -> None:
    await store.detach("never")
    await store.remove("never")
    ws = await store.create("gone", 64)
    await store.attach("gone")
    await store.remove("gone")
    assert not ws.image.exists() and not store.mount_point("gone").exists()
    await store.remove("gone")
    await store.detach("gone")
    assert not loopdev.loops_backed_by(ws.image)


async def test_pool_restart_reuses_the_mounted_and_the_unmounted_image(home: Path) -> None:
    store = await workspace_store(home)
    await store.create("keep", 64)
    (await store.attach("keep") / "upper" / "f").write_text("1")
    await store.detach("keep")
    device = store.pool.state.device

    again = await workspace_store(home)  # still mounted: reused as is
    assert again.pool.state.device == device
    await again.pool.unmount()
    assert not mounts_under(home) and not loopdev.loops_under(home)
    await again.pool.unmount()  # idempotent

    third = await workspace_store(home)  # image on disk, not mounted: mounted again, not remade
    assert third.pool.state.kind == "image"
    assert (await third.attach("keep") / "upper" / "f").read_text() == "1"
    await third.detach("keep")


async def test_a_corrupt_pool_image_is_a_clear_error(home: Path) -> None:
    (home / "workspaces.xfs").write_bytes(b"\xff" * (1 << 20))
    with pytest.raises(FailedPrecondition, match="xfs_repair"):
        await ReflinkPool(home, backing="image").start()
    assert not loopdev.loops_under(home)


async def test_the_pool_never_admits_more_than_it_can_hold(home: Path) -> None:
    store = await workspace_store(home)
    await store.create("one", 600)
    with pytest.raises(NotEnoughSpace):
        await store.create("two", 600)
    with pytest.raises(NotEnoughSpace):
        await store.clone("one", "fork")  # a fork child may fill its 600 MiB too
    # A snapshot is never written: it counts with what it holds (a fresh mkfs: a few MiB).
    (store.pool.path / "snapshots").mkdir()
    await store.clone("one", store.pool.path / "snapshots" / "snap.img")
    await store.remove("one")
    await store.create("two", 600)
    assert set(store.observe().images) == {"two"}


async def test_a_thin_pool_admits_its_overcommit_and_keeps_headroom_for_running_ones(
    home: Path,
) -> None:
    store = await workspace_store(home, overcommit=3.0)
    for name in ("one", "two", "three"):
        await store.create(name, 900)  # 2,700 MiB promised on a pool of 1 GiB
    with pytest.raises(NotEnoughSpace, match="committed"):
        await store.create("four", 900)
    await store.remove("three")
    # Real space, not promises, is what keeps running sandboxes writing: once less than a
    # twentieth of the pool is free, nothing new is admitted.
    mount_point = await store.attach("one")
    filler = mount_point / "filler"
    free = store.pool.free_bytes()
    keep = store.pool.capacity_bytes() // 20 - (8 << 20)
    await dd(filler, max(1, (free - keep) >> 20), "/dev/urandom")
    with pytest.raises(NotEnoughSpace, match="kept for its running sandboxes"):
        await store.create("three", 32)
    filler.unlink()
    await store.detach("one")
    for name in ("one", "two"):
        await store.remove(name)


async def test_a_pool_without_reflinks_creates_but_refuses_clones(home: Path) -> None:
    pool = ReflinkPool(home, backing="dir")  # /tmp is ext4 here
    state = await pool.start()
    if state.reflink:
        pytest.skip("/tmp can reflink on this host")
    assert state.kind == "dir" and not (home / "workspaces.xfs").exists()
    store = WorkspaceStore(pool)
    await store.create("plain", 64)
    with pytest.raises(NotReflinkable):
        await store.clone("plain", "child")
    (await store.attach("plain") / "upper" / "f").write_text("ok")
    await store.remove("plain")


async def test_grow_detached_and_attached(store: WorkspaceStore) -> None:
    await store.create("grow", 64)
    (await store.attach("grow") / "upper" / "keep").write_text("kept")
    await store.detach("grow")
    assert (await store.grow("grow", 160)).size_mb == 160
    assert not store.is_attached("grow") and not store.mount_point("grow").exists()
    mnt = await store.attach("grow")
    assert (mnt / "upper" / "keep").read_text() == "kept"
    done = await dd(mnt / "upper" / "big", 100)  # past the old size
    assert done.returncode == 0, done.stderr
    if has_cap_sys_resource():
        assert (await store.grow("grow", 200)).size_mb == 200
        assert os.statvfs(mnt).f_blocks * os.statvfs(mnt).f_frsize > 180 << 20
    else:  # e.g. a container without CAP_SYS_RESOURCE: online resize is refused, clearly
        with pytest.raises(FailedPrecondition, match="CAP_SYS_RESOURCE"):
            await store.grow("grow", 200)
        assert store.get("grow").size_mb == 160  # refused before anything changed
    assert (mnt / "upper" / "big").stat().st_size == 100 << 20
    await store.detach("grow")
    with pytest.raises(InvalidArgument):
        await store.grow("grow", 100)


async def test_auto_uses_the_directory_if_it_reflinks_else_makes_an_image(home: Path) -> None:
    pool = ReflinkPool(home, image_size_bytes=POOL_BYTES)
    state = await pool.start()
    assert state.reflink
    assert state.kind == ("image" if (home / "workspaces.xfs").exists() else "dir")
    assert await ReflinkPool(home).start() == state  # a restart finds the same pool
    assert not [p for p in (home / "workspaces").iterdir() if p.name.startswith(".reflink")]
