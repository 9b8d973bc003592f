"""A layer directory → OCI tar (``export_tree``) → the same directory (``unpack_layer``), and the
tar is the same bytes for the same tree wherever it is made (one layer, one blob)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest

from aenv.storage.layer_tar import export_tree
from aenv.storage.unpack import UnpackLimits, unpack_layer
from tests.storage.conftest import needs_root
from tests.storage.trees import OPAQUE, XATTR_VALUE, make_layer_tree, tree_state

pytestmark = needs_root


def export(root: Path) -> bytes:
    out = io.BytesIO()
    export_tree(root, out)
    return out.getvalue()


def unpack(data: bytes, dest: Path) -> None:
    dest.mkdir()
    result = unpack_layer(io.BytesIO(data), dest, limits=UnpackLimits(max_bytes=1 << 30))
    assert result.skipped == ()


def test_round_trip_keeps_every_kind_of_entry(tmp_path: Path) -> None:
    source = make_layer_tree(tmp_path / "source")
    data = export(source)
    unpack(data, tmp_path / "copy")

    assert tree_state(tmp_path / "copy") == tree_state(source)
    copy = tmp_path / "copy"
    # The state comparison covers these; spelled out, they are what a restore relies on.
    assert stat.S_IMODE(os.lstat(copy / "bin/su").st_mode) == 0o4755
    assert os.lstat(copy / "home/user/secret")[4:6] == (1000, 1000)
    assert os.lstat(copy / "bin/ls").st_ino == os.lstat(copy / "bin/busybox").st_ino
    assert os.readlink(copy / "bin/sh") == "busybox"
    assert stat.S_ISFIFO(os.lstat(copy / "run/fifo").st_mode)
    removed = os.lstat(copy / "etc/removed")
    assert stat.S_ISCHR(removed.st_mode) and removed.st_rdev == 0
    assert os.getxattr(copy / "var/cache", OPAQUE) == b"y"
    assert os.getxattr(copy / "etc/passwd", "user.note") == XATTR_VALUE
    assert os.listdir(copy / "empty") == []
    assert os.lstat(copy / "etc/passwd").st_mtime == os.lstat(source / "etc/passwd").st_mtime


def test_the_tar_is_an_oci_layer(tmp_path: Path) -> None:
    """Whiteouts and opaque directories in OCI form; nothing in it names this machine."""
    source = make_layer_tree(tmp_path / "source")
    with tarfile.open(fileobj=io.BytesIO(export(source))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    names = list(members)
    assert names[0] == "."
    seen: set[str] = {"."}
    for name in names[1:]:  # every parent before its children
        assert (name.rpartition("/")[0] or ".") in seen, name
        seen.add(name)
    assert "etc/.wh.removed" in members and "etc/removed" not in members
    assert members["etc/.wh.removed"].isreg() and members["etc/.wh.removed"].size == 0
    assert members["var/cache/.wh..wh..opq"].isreg()
    assert members["bin/ls"].islnk() and members["bin/ls"].linkname == "bin/busybox"
    assert members["bin/sh"].issym() and members["run/fifo"].isfifo()
    assert all(m.uname == "" and m.gname == "" for m in members.values())
    assert "SCHILY.xattr.trusted.overlay.opaque" not in members["var/cache"].pax_headers
    assert "SCHILY.xattr.user.cache" in members["var/cache"].pax_headers


def test_same_tree_same_bytes(tmp_path: Path) -> None:
    first = make_layer_tree(tmp_path / "one")
    second = make_layer_tree(tmp_path / "two")  # another copy: other inodes, same layer
    digest = hashlib.sha256(export(first)).hexdigest()
    assert hashlib.sha256(export(first)).hexdigest() == digest  # exported twice
    assert hashlib.sha256(export(second)).hexdigest() == digest
    # What was unpacked from the tar exports to the tar again (a node that imported a layer
    # and snapshots a sandbox on it finds the blob already in the repository).
    unpack(export(first), tmp_path / "unpacked")
    assert hashlib.sha256(export(tmp_path / "unpacked")).hexdigest() == digest


@pytest.mark.parametrize("change", ["content", "mode", "owner", "mtime", "xattr", "name"])
def test_any_change_changes_the_digest(tmp_path: Path, change: str) -> None:
    base = export(make_layer_tree(tmp_path / "base"))
    tree = make_layer_tree(tmp_path / "changed")
    target = tree / "etc/passwd"
    st = os.lstat(target)
    if change == "content":
        make_layer_tree(tmp_path / "other", variant="x")
        tree = tmp_path / "other"
    elif change == "mode":
        target.chmod(0o600)
    elif change == "owner":
        os.chown(target, 1, 1)
    elif change == "mtime":
        os.utime(target, (st.st_atime, st.st_mtime + 1))
    elif change == "xattr":
        os.setxattr(target, "user.note", b"other")
    else:
        shutil.move(tree / "empty", tree / "empty2")
    assert export(tree) != base
