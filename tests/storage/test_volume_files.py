"""The volume content API's file operations: E2B's semantics, and no way out of the volume root.

Each volume is ``tmp_path / "vol"``; host files next to it (``tmp_path / "outside"``) are the
sentinels that must never be read, written or removed through the volume.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from aenv.core.errors import Conflict, InvalidArgument, NotEnoughSpace, NotFound
from aenv.storage import volume_files as vf


@pytest.fixture
def vol(tmp_path: Path) -> Path:
    root = tmp_path / "vol"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    sentinel = tmp_path / "outside"
    sentinel.mkdir()
    (sentinel / "secret").write_text("host secret")
    return sentinel


def write(root: Path, path: str, data: bytes, *, force: bool = False, **kw: int) -> vf.EntryStat:
    fd = vf.open_write(root, path, force=force, **kw)
    for start in range(0, len(data), 1000):
        vf.write_all(root, fd, path, data[start:start + 1000])
    return vf.finish_write(root, fd, path)


def read(root: Path, path: str) -> bytes:
    fd, _ = vf.open_read(root, path)
    try:
        pieces = []
        while piece := os.read(fd, 7):
            pieces.append(piece)
        return b"".join(pieces)
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_fd_leak() -> Iterator[None]:
    before = open_fds()
    yield
    assert open_fds() == before


def test_clean_path() -> None:
    assert vf.clean_path("a/b/") == "/a/b"
    assert vf.clean_path("/../x") == "/x"
    assert vf.clean_path("//x//y/./z/..") == "/x/y"
    for bad in ("", "a\0b"):
        with pytest.raises(InvalidArgument):
            vf.clean_path(bad)


def test_write_read_stat_round_trip(vol: Path) -> None:
    data = os.urandom(5000)
    entry = write(vol, "notes.bin", data, uid=1234, gid=4321, mode=0o640)
    assert entry.path == "/notes.bin" and entry.name == "notes.bin"
    assert (entry.type, entry.size, entry.mode, entry.uid, entry.gid) == (
        "file", 5000, 0o640, 1234, 4321)
    assert entry.target is None and entry.mtime.tzinfo is not None
    assert read(vol, "/notes.bin") == data
    assert replace(vf.stat(vol, "/notes.bin"), atime=entry.atime) == entry  # reading sets atime
    fd, size = vf.open_read(vol, "/notes.bin")
    os.close(fd)
    assert size == 5000
    root = vf.stat(vol, "/")
    assert (root.name, root.path, root.type) == ("/", "/", "directory")


def test_default_owner_and_mode_ignore_umask(vol: Path) -> None:
    old = os.umask(0o077)
    try:
        entry = write(vol, "/f", b"x")
        made = vf.make_dir(vol, "/d")
    finally:
        os.umask(old)
    assert (entry.uid, entry.gid, entry.mode) == (9090, 9090, 0o666)
    assert (made.uid, made.gid, made.mode, made.type) == (9090, 9090, 0o777, "directory")


def test_exclusive_create_conflicts(vol: Path) -> None:
    write(vol, "/f", b"first")
    with pytest.raises(Conflict):
        vf.open_write(vol, "/f")
    vf.make_dir(vol, "/d")
    with pytest.raises(Conflict):
        vf.open_write(vol, "/d")
    assert read(vol, "/f") == b"first"


def test_missing_parent_is_not_found(vol: Path) -> None:
    with pytest.raises(NotFound):
        vf.open_write(vol, "/no/such/file")
    with pytest.raises(NotFound):
        vf.make_dir(vol, "/no/dir")
    with pytest.raises(NotFound):
        vf.stat(vol, "/nothing")
    assert os.listdir(vol) == []


def test_force_creates_parents_and_truncates(vol: Path) -> None:
    entry = write(vol, "/a/b/c.txt", b"long content", force=True, uid=7, gid=8)
    assert entry.size == 12
    for parent in ("/a", "/a/b"):
        made = vf.stat(vol, parent)
        assert (made.type, made.mode, made.uid, made.gid) == ("directory", 0o777, 7, 8)
    assert write(vol, "/a/b/c.txt", b"short", force=True).size == 5
    assert read(vol, "/a/b/c.txt") == b"short"
    with pytest.raises(InvalidArgument):
        vf.open_write(vol, "/a/b", force=True)  # a directory is there
    with pytest.raises(InvalidArgument):
        vf.open_write(vol, "/a/b/c.txt/x", force=True)  # through a file


def test_list_depth_and_order(vol: Path) -> None:
    for path in ("/b/y/deep.txt", "/b/x.txt", "/a.txt", "/c/z.txt"):
        write(vol, path, b"1", force=True)
    (vol / "link").symlink_to("b")
    names = [e.path for e in vf.list_dir(vol, "/", 1)]
    assert names == ["/a.txt", "/b", "/c", "/link"]
    assert [e.path for e in vf.list_dir(vol, "/", None)] == names
    assert [e.path for e in vf.list_dir(vol, "/", 0)] == names
    deep = [e.path for e in vf.list_dir(vol, "/", 2)]
    assert deep == ["/a.txt", "/b", "/b/x.txt", "/b/y", "/c", "/c/z.txt", "/link"]
    link = vf.list_dir(vol, "/", 1)[3]
    assert (link.type, link.target, link.name) == ("directory", "b", "link")
    assert [e.path for e in vf.list_dir(vol, "/b", 10)] == ["/b/x.txt", "/b/y", "/b/y/deep.txt"]
    with pytest.raises(InvalidArgument) as caught:
        vf.list_dir(vol, "/", 11)
    assert caught.value.reason == "DEPTH_OUT_OF_RANGE"
    with pytest.raises(InvalidArgument):
        vf.list_dir(vol, "/a.txt", 1)
    with pytest.raises(NotFound):
        vf.list_dir(vol, "/missing", 1)


def test_make_dir_conflict_and_force(vol: Path) -> None:
    made = vf.make_dir(vol, "/d", mode=0o750, uid=5, gid=6)
    assert (made.mode, made.uid, made.gid) == (0o750, 5, 6)
    with pytest.raises(Conflict):
        vf.make_dir(vol, "/d")
    assert vf.make_dir(vol, "/d", force=True) == vf.stat(vol, "/d")
    assert vf.make_dir(vol, "/x/y/z", force=True).path == "/x/y/z"
    write(vol, "/f", b"")
    with pytest.raises(Conflict):
        vf.make_dir(vol, "/f", force=True)
    with pytest.raises(InvalidArgument):
        vf.make_dir(vol, "/f/sub", force=True)
    with pytest.raises(Conflict):
        vf.make_dir(vol, "/")
    (vol / "link").symlink_to("/d")  # resolved in the volume: its /d
    assert vf.make_dir(vol, "/link/in").path == "/link/in"
    assert vf.make_dir(vol, "/link/deeper/in", force=True).type == "directory"
    assert (vol / "d" / "in").is_dir() and (vol / "d" / "deeper" / "in").is_dir()


def test_remove(vol: Path, outside: Path) -> None:
    with pytest.raises(InvalidArgument) as caught:
        vf.remove(vol, "/..")
    assert caught.value.reason == "CANNOT_DELETE_ROOT"
    with pytest.raises(NotFound):
        vf.remove(vol, "/missing")
    write(vol, "/t/a/b/c/file", b"x", force=True)
    (vol / "t" / "a" / "host").symlink_to(outside)
    (vol / "t" / "hostfile").symlink_to(outside / "secret")
    vf.remove(vol, "/t")
    assert os.listdir(vol) == []
    (vol / "esc").symlink_to(outside)
    vf.remove(vol, "/esc")
    assert os.listdir(vol) == []
    assert (outside / "secret").read_text() == "host secret"


def test_remove_a_tree_deeper_than_the_recursion_limit(vol: Path) -> None:
    fd = os.open(vol, os.O_RDONLY)
    try:
        for _ in range(1500):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    vf.remove(vol, "/d")
    assert os.listdir(vol) == []


def test_update_metadata(vol: Path, outside: Path) -> None:
    write(vol, "/f", b"x")
    entry = vf.update_metadata(vol, "/f", uid=11, mode=0o4755)
    assert (entry.uid, entry.gid, entry.mode) == (11, 9090, 0o755)
    assert os.stat(vol / "f").st_mode & 0o7777 == 0o4755  # set-id survives the chown
    assert vf.update_metadata(vol, "/f", gid=12).gid == 12
    root = vf.update_metadata(vol, "/", mode=0o711)
    assert root.mode == 0o711
    before = os.stat(outside / "secret")
    (vol / "link").symlink_to(outside / "secret")
    link = vf.update_metadata(vol, "/link", uid=99, gid=98, mode=0o600)
    assert (link.uid, link.gid, link.type) == (99, 98, "unknown")
    after = os.stat(outside / "secret")
    assert (after.st_mode, after.st_uid, after.st_gid) == (
        before.st_mode, before.st_uid, before.st_gid)
    with pytest.raises(NotFound):
        vf.update_metadata(vol, "/missing", mode=0o600)


def test_absolute_symlink_stays_in_the_root(vol: Path) -> None:
    (vol / "esc").symlink_to("/etc")
    for call in (vf.stat, vf.open_read):
        with pytest.raises(NotFound):
            call(vol, "/esc/passwd")
    assert vf.stat(vol, "/esc").type == "unknown"
    write(vol, "/etc/passwd", b"inside", force=True)
    assert read(vol, "/esc/passwd") == b"inside"
    assert vf.stat(vol, "/esc").type == "directory"


def test_relative_symlink_cannot_climb(vol: Path, outside: Path) -> None:
    (vol / "up").symlink_to("../../../..")
    up = vf.stat(vol, "/up")
    assert (up.type, up.target) == ("directory", "../../../..")
    write(vol, "/marker", b"m")
    assert [e.name for e in vf.list_dir(vol, "/up", 1)] == ["marker", "up"]
    with pytest.raises(NotFound):
        vf.open_read(vol, "/up/outside/secret")
    (vol / "rel").symlink_to("../outside/secret")
    with pytest.raises(NotFound):
        vf.open_read(vol, "/rel")


def test_writes_through_links_never_leave_the_root(vol: Path, outside: Path) -> None:
    (vol / "dirlink").symlink_to(outside)
    (vol / "filelink").symlink_to(outside / "new")
    (vol / "secretlink").symlink_to(outside / "secret")
    with pytest.raises(NotFound):
        vf.open_write(vol, "/dirlink/x")
    with pytest.raises(Conflict):
        vf.open_write(vol, "/dirlink/x", force=True)
    with pytest.raises(Conflict):
        vf.open_write(vol, "/filelink")
    with pytest.raises(NotFound):
        vf.open_write(vol, "/filelink", force=True)
    with pytest.raises(NotFound):
        vf.open_write(vol, "/secretlink", force=True)
    with pytest.raises(NotFound):
        vf.make_dir(vol, "/dirlink/sub")
    with pytest.raises(Conflict):
        vf.make_dir(vol, "/dirlink/sub", force=True)
    assert write(vol, "../outside/x", b"in", force=True).path == "/outside/x"
    assert (vol / "outside" / "x").read_bytes() == b"in"
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_text() == "host secret"


def test_nul_byte_and_dotdot(vol: Path) -> None:
    with pytest.raises(InvalidArgument):
        vf.stat(vol, "/a\0b")
    write(vol, "/f", b"x")
    assert vf.stat(vol, "/../../f").path == "/f"


def test_fifo_is_never_opened(vol: Path) -> None:
    os.mkfifo(vol / "fifo")
    with pytest.raises(InvalidArgument):
        vf.open_read(vol, "/fifo")
    with pytest.raises(InvalidArgument):
        vf.open_write(vol, "/fifo", force=True)
    assert vf.stat(vol, "/fifo").type == "unknown"


@pytest.fixture
def tiny_volume(tmp_path: Path) -> Iterator[Path]:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("needs mkfs.ext4")
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    image = tmp_path / "tiny.ext4"
    with image.open("wb") as f:
        f.truncate(2 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_full_volume(tiny_volume: Path) -> None:
    fd = vf.open_write(tiny_volume, "/big")
    with pytest.raises(NotEnoughSpace) as caught:
        for _ in range(4):
            vf.write_all(tiny_volume, fd, "/big", b"\1" * (1 << 20))
        vf.finish_write(tiny_volume, fd, "/big")
    assert "tiny is full" in caught.value.message
    with pytest.raises(NotFound):
        vf.stat(tiny_volume, "/big")
    assert write(tiny_volume, "/small", b"fits").size == 4
