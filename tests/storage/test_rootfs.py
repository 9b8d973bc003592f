"""Overlay root filesystems: isolation, deltas, remounts, recovery, limits, hostile layers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aenv.core import proc
from aenv.core.errors import CommandError, Conflict, InvalidArgument, NotFound
from aenv.storage.layers import Layer, LayerStore, layer_id_for
from aenv.storage.overlay import MAX_LOWERS
from aenv.storage.rootfs import RootfsStore
from tests.storage.conftest import files_in, make_tree, mounts_under, needs_root, snapshot_tree

pytestmark = [pytest.mark.anyio, needs_root]


async def as_user(rootfs: Path, script: str) -> str:
    """Run ``script`` with the rootfs's /bin/sh as uid/gid 1000 (the sandbox's ``user``)."""
    done = await proc.run(
        ["chroot", "--userspec=1000:1000", str(rootfs), "/bin/sh", "-c", script], timeout=30
    )
    return done.text


async def test_two_sandboxes_share_a_lower_and_keep_their_writes_apart(
    roots: RootfsStore, busybox_layer: Layer
) -> None:
    before = snapshot_tree(busybox_layer.path)
    a = await roots.assemble("sbx-a", [busybox_layer.path])
    b = await roots.assemble("sbx-b", [busybox_layer.path])
    assert a != b and roots.is_mounted("sbx-a") and roots.is_mounted("sbx-b")

    await as_user(a, "echo from-a > /home/user/note; echo t > /tmp/a-only")
    await as_user(b, "echo from-b > /home/user/note")
    (a / "etc" / "hostname").write_text("changed-in-a\n")
    (a / "usr" / "bin" / "wget").unlink()  # deleting a lower file becomes a whiteout in a's upper

    assert (a / "home/user/note").read_text() == "from-a\n"
    assert (b / "home/user/note").read_text() == "from-b\n"
    assert not (b / "tmp/a-only").exists() and (b / "usr/bin/wget").is_symlink()
    assert (b / "etc/hostname").read_text() == "sandbox\n"
    # The lower is untouched and each upper holds exactly its delta.
    assert snapshot_tree(busybox_layer.path) == before
    upper_a = roots.paths("sbx-a").upper
    assert files_in(upper_a) == {
        "home",
        "home/user",
        "home/user/note",
        "tmp",
        "tmp/a-only",
        "etc",
        "etc/hostname",
        "usr",
        "usr/bin",
        "usr/bin/wget",
    }
    wh = (upper_a / "usr/bin/wget").lstat()
    assert os.major(wh.st_rdev) == 0 and os.minor(wh.st_rdev) == 0  # an overlay whiteout
    assert files_in(roots.paths("sbx-b").upper) == {"home", "home/user", "home/user/note"}

    await roots.disassemble("sbx-a", keep_upper=False)
    await roots.disassemble("sbx-b", keep_upper=False)
    assert not roots.paths("sbx-a").dir.exists() and not roots.paths("sbx-b").dir.exists()
    assert roots.list_mounted() == []


async def test_the_user_can_write_home_and_tmp(roots: RootfsStore, busybox_layer: Layer) -> None:
    rootfs = await roots.assemble("sbx", [busybox_layer.path])
    out = await as_user(rootfs, "id -u; touch /home/user/f /tmp/f && echo ok; touch /etc/x || :")
    assert out.split() == ["1000", "ok"]
    assert (rootfs / "home/user/f").stat().st_uid == 1000
    assert not (rootfs / "etc/x").exists()
    await roots.disassemble("sbx", keep_upper=False)


async def test_unmount_and_remount_keep_the_files(roots: RootfsStore, busybox_layer: Layer) -> None:
    rootfs = await roots.assemble("sbx", [busybox_layer.path])
    await as_user(rootfs, "echo kept > /home/user/kept")
    await roots.disassemble("sbx", keep_upper=True)
    assert not roots.is_mounted("sbx") and not (rootfs / "home").exists()
    assert (roots.paths("sbx").upper / "home/user/kept").exists()

    # After a "reboot" the record alone is enough to bring the sandbox back ...
    assert await roots.ensure_mounted("sbx") == rootfs
    assert (rootfs / "home/user/kept").read_text() == "kept\n"
    await roots.disassemble("sbx", keep_upper=True)
    # ... and assemble over the same lowers reuses the upper too.
    assert await roots.assemble("sbx", [busybox_layer.path]) == rootfs
    assert (rootfs / "home/user/kept").read_text() == "kept\n"
    await roots.disassemble("sbx", keep_upper=False)
    with pytest.raises(NotFound):
        await roots.ensure_mounted("sbx")


async def test_assemble_is_idempotent_and_guards_its_upper(
    roots: RootfsStore, busybox_layer: Layer, tmp_path: Path
) -> None:
    other = make_tree(tmp_path / "other", {"x": "1"})
    rootfs = await roots.assemble("sbx", [busybox_layer.path])
    assert await roots.assemble("sbx", [busybox_layer.path]) == rootfs
    assert await roots.ensure_mounted("sbx") == rootfs
    assert len(mounts_under(roots.paths("sbx").dir)) == 1
    with pytest.raises(Conflict):
        await roots.assemble("sbx", [other])  # mounted over other lowers
    await roots.disassemble("sbx", keep_upper=True)
    with pytest.raises(Conflict):
        await roots.assemble("sbx", [other])  # the upper belongs to the busybox lower
    assert not roots.is_mounted("sbx")
    await roots.disassemble("sbx", keep_upper=False)
    await roots.disassemble("sbx", keep_upper=False)  # idempotent


async def test_layers_stack_lowest_first_and_recovery_sees_them(
    roots: RootfsStore, layers: LayerStore
) -> None:
    ids = [layer_id_for({"n": n}) for n in range(3)]
    paths = []
    for n, layer_id in enumerate(ids):
        async with layers.staging(layer_id) as staging:
            make_tree(staging, {"which": f"layer{n}\n", f"only{n}": "x"})
            paths.append((await layers.put_from_dir(staging, layer_id)).path)
    rootfs = await roots.assemble("stack", paths)  # layer0 is the base, layer2 the top
    assert (rootfs / "which").read_text() == "layer2\n"
    assert {p.name for p in rootfs.iterdir()} >= {"only0", "only1", "only2", "which", "tmp"}

    [found] = roots.list_mounted()
    assert found.sandbox_id == "stack" and found.rootfs == rootfs
    assert found.lowerdir == tuple(reversed(ids))  # the kernel's order, relative names
    assert roots.recorded_lowers("stack") == paths
    assert roots.sandbox_ids() == ["stack"]
    assert roots.layers_referenced() == set(paths)
    await roots.disassemble("stack", keep_upper=True)
    assert roots.list_mounted() == [] and roots.layers_referenced() == set(paths)
    await roots.disassemble("stack", keep_upper=False)
    assert roots.layers_referenced() == set() and roots.sandbox_ids() == []


async def test_a_layer_without_tmp_and_home_gets_them(roots: RootfsStore, tmp_path: Path) -> None:
    bare = make_tree(tmp_path / "bare", {"etc/passwd": "user:x:1000:1000::/home/user:/bin/sh\n"})
    (bare / "bin").mkdir()
    (bare / "bin/sh").symlink_to("/bin/busybox")
    (bare / "bin/busybox").write_bytes(Path("/bin/busybox").read_bytes())
    (bare / "bin/busybox").chmod(0o755)
    rootfs = await roots.assemble("bare", [bare])
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    home = (rootfs / "home/user").stat()
    assert (home.st_uid, home.st_gid) == (1000, 1000)
    await as_user(rootfs, "touch /home/user/ok /tmp/ok")
    await roots.disassemble("bare", keep_upper=False)


async def test_hostile_symlinks_in_a_layer_are_never_followed(
    roots: RootfsStore, tmp_path: Path
) -> None:
    # An image whose /tmp and /home point at host directories (absolute links resolve on the
    # host when we, not the sandbox, follow them).
    victim = make_tree(tmp_path / "victim", {"keep": "1"})
    victim.chmod(0o700)
    evil = make_tree(tmp_path / "evil", {"etc/passwd": "user:x:0:0::/:/bin/sh\n"})
    (evil / "tmp").symlink_to(victim)
    (evil / "home").symlink_to(victim)
    rootfs = await roots.assemble("evil", [evil])
    assert victim.stat().st_mode & 0o7777 == 0o700
    assert files_in(victim) == {"keep"}
    assert (rootfs / "tmp").is_symlink()
    await roots.disassemble("evil", keep_upper=False)


async def test_many_layers_fit_in_one_mount_and_too_many_are_refused(
    roots: RootfsStore, layers: LayerStore, tmp_path: Path
) -> None:
    paths = []
    for n in range(50):  # 50 x 65 bytes of relative names; absolute ones would not fit a page
        layer_id = layer_id_for({"deep": n})
        async with layers.staging(layer_id) as staging:
            make_tree(staging, {f"f{n}": str(n)})
            paths.append((await layers.put_from_dir(staging, layer_id)).path)
    assert len(":".join(str(p) for p in paths)) > 4096
    rootfs = await roots.assemble("deep", paths)
    assert (rootfs / "f0").read_text() == "0" and (rootfs / "f49").read_text() == "49"
    await roots.disassemble("deep", keep_upper=False)

    many = []
    for n in range(70):
        many.append(make_tree(tmp_path / "l" / layer_id_for({"many": n}), {}))
    with pytest.raises(InvalidArgument, match="compact"):
        await roots.assemble("toomany", many)
    assert not roots.paths("toomany").upper.exists()
    with pytest.raises(InvalidArgument, match="limit"):
        await roots.assemble("toomany", [many[0]] * (MAX_LOWERS + 1))


async def test_bad_input_is_refused_before_anything_is_made(
    roots: RootfsStore, tmp_path: Path
) -> None:
    good = make_tree(tmp_path / "good", {"x": "1"})
    for bad_id in ("../escape", ".hidden", "a/b", "", "x" * 200):
        with pytest.raises(InvalidArgument):
            await roots.assemble(bad_id, [good])
    with pytest.raises(NotFound):
        await roots.assemble("sbx", [tmp_path / "missing"])
    with pytest.raises(InvalidArgument):
        await roots.assemble("sbx", [make_tree(tmp_path / "a:b", {})])
    with pytest.raises(InvalidArgument):
        await roots.assemble("sbx", [])
    with pytest.raises(InvalidArgument):
        await roots.assemble("sbx", [good, good])
    assert not roots.root.exists() or list(roots.root.iterdir()) == []


async def test_mount_failure_cleans_a_fresh_sandbox(
    roots: RootfsStore, busybox_layer: Layer
) -> None:
    # A workdir that is not a directory makes the kernel refuse the mount.
    paths = roots.paths("broken")
    paths.dir.mkdir(parents=True)
    paths.work.write_text("not a directory")
    with pytest.raises(CommandError):
        await roots.assemble("broken", [busybox_layer.path])
    assert not roots.is_mounted("broken")
    assert not paths.upper.exists() and not paths.record.exists()
    # Fixed, the same sandbox assembles fine.
    paths.work.unlink()
    assert await roots.assemble("broken", [busybox_layer.path]) == paths.rootfs
    await roots.disassemble("broken", keep_upper=False)
