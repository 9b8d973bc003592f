"""filesystem.Filesystem RPCs through the official SDK: stat, list, make_dir, rename, remove.

What the SDK and E2B's own tests rely on (e2b-compat.md §4.3, §10.14): EntryInfo fields exactly
as envd builds them, already_exists / not_found / invalid_argument where the SDK branches on
them, and Remove of a missing path succeeding. A few raw-protocol cases (malformed bodies) use
httpx, since the SDK would never send them.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
)

from tests.envd.connect_wire import UNARY_HEADERS
from tests.envd.harness import USER_UID, EnvdSandbox


def _rel(path: str) -> str:
    """``path`` relative to the default user's home, as SDK users often write it."""
    return path.removeprefix("/home/user/")


# -- get_info / exists ------------------------------------------------------------------------


def test_get_info_of_file(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/f.txt", "test")
    info = sandbox.files.get_info(f"{_rel(workdir)}/f.txt")
    assert info.name == "f.txt"
    assert info.type == FileType.FILE
    assert info.path == f"{workdir}/f.txt"
    assert info.size == 4
    assert info.mode == 0o644
    assert info.permissions == "-rw-r--r--"
    assert (info.owner, info.group) == ("user", "user")
    assert info.symlink_target is None
    assert info.metadata is None
    age = datetime.now(UTC) - info.modified_time
    assert abs(age.total_seconds()) < 60


def test_get_info_of_directory(sandbox: Sandbox, workdir: str) -> None:
    info = sandbox.files.get_info(workdir)
    assert info.type == FileType.DIR
    assert info.path == workdir
    assert info.mode == 0o755
    assert info.permissions == "drwxr-xr-x"
    assert (info.owner, info.group) == ("user", "user")


def test_get_info_of_special_permissions(sandbox: Sandbox, workdir: str) -> None:
    sandbox.commands.run(f"mkdir {workdir}/sticky && chmod 1777 {workdir}/sticky")
    sandbox.commands.run(f"touch {workdir}/suid && chmod 4755 {workdir}/suid", user="root")
    assert sandbox.files.get_info(f"{workdir}/sticky").permissions == "dtrwxrwxrwx"
    info = sandbox.files.get_info(f"{workdir}/suid")
    assert (info.permissions, info.mode, info.owner) == ("urwxr-xr-x", 0o755, "root")


def test_get_info_of_tilde_path(sandbox: Sandbox, workdir: str) -> None:
    info = sandbox.files.get_info(f"~/{_rel(workdir)}")
    assert info.path == workdir


def test_get_info_missing(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{workdir}/nope")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info(f"{workdir}/nope/deeper")


def test_exists(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/here.txt", "x")
    assert sandbox.files.exists(f"{workdir}/here.txt")
    assert sandbox.files.exists(workdir)
    assert not sandbox.files.exists(f"{workdir}/missing.txt")


def test_symlink_to_file(sandbox: Sandbox, workdir: str, envd: EnvdSandbox) -> None:
    sandbox.files.write(f"{workdir}/target.txt", "abc")
    sandbox.commands.run(f"cd {workdir} && ln -s target.txt link")
    info = sandbox.files.get_info(f"{workdir}/link")
    assert info.type == FileType.FILE  # the target's type, as E2B's envd reports it
    assert info.name == "link"
    assert info.symlink_target == f"{workdir}/target.txt"
    assert info.permissions == "Lrwxrwxrwx"
    assert info.mode == 0o644  # the target's permission bits
    assert info.size == len("target.txt")  # the link's own size, as Go's Lstat reports
    # E2B's envd has no isSymlink; sent true, SDK 2.63 would report SYMLINK instead.
    response = httpx.post(f"{envd.url}/filesystem.Filesystem/Stat",
                          json={"path": f"{workdir}/link"}, headers=UNARY_HEADERS)
    entry = response.json()["entry"]
    assert entry["type"] == "FILE_TYPE_FILE" and "isSymlink" not in entry
    assert entry["symlinkTarget"] == f"{workdir}/target.txt"


def test_symlink_to_directory_in_listing(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/real/inner")
    sandbox.commands.run(f"ln -s {workdir}/real {workdir}/alias")
    entries = {e.path: e for e in sandbox.files.list(workdir, depth=3)}
    # The link is listed but never followed: nothing below "alias".
    assert set(entries) == {f"{workdir}/alias", f"{workdir}/real", f"{workdir}/real/inner"}
    assert entries[f"{workdir}/alias"].type == FileType.DIR
    assert entries[f"{workdir}/alias"].symlink_target == f"{workdir}/real"


def test_dangling_symlink(sandbox: Sandbox, workdir: str) -> None:
    sandbox.commands.run(f"ln -s {workdir}/gone {workdir}/dangling")
    info = sandbox.files.get_info(f"{workdir}/dangling")
    assert info.type is None  # no target, no type: unspecified, as in E2B's envd
    assert info.symlink_target == f"{workdir}/dangling"  # unresolvable: the link itself
    # Its type is unspecified on the wire, which the SDK drops from listings.
    assert sandbox.files.list(workdir) == []


def test_list_through_symlinked_directory(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/real/a.txt", "a")
    sandbox.commands.run(f"ln -s {workdir}/real {workdir}/alias")
    [entry] = sandbox.files.list(f"{workdir}/alias")
    assert entry.path == f"{workdir}/alias/a.txt"


# -- list -------------------------------------------------------------------------------------


def test_list_with_depth(sandbox: Sandbox, workdir: str) -> None:
    for sub in ("subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2/subdir2_1"):
        sandbox.files.make_dir(f"{workdir}/{sub}")
    sandbox.files.write(f"{workdir}/file1.txt", "Hello, world!")
    sandbox.files.write(f"{workdir}/subdir2/subdir2_1/deep.txt", "deep")

    one = sandbox.files.list(_rel(workdir))
    assert [e.name for e in one] == ["file1.txt", "subdir1", "subdir2"]
    assert [e.type for e in one] == [FileType.FILE, FileType.DIR, FileType.DIR]
    assert one[0].path == f"{workdir}/file1.txt"
    assert one[0].size == 13

    two = sandbox.files.list(workdir, depth=2)
    assert [e.path.removeprefix(workdir + "/") for e in two] == [
        "file1.txt", "subdir1", "subdir1/subdir1_1", "subdir1/subdir1_2", "subdir2",
        "subdir2/subdir2_1",
    ]
    three = sandbox.files.list(workdir, depth=3)
    assert len(three) == len(two) + 1
    assert three[-1].path == f"{workdir}/subdir2/subdir2_1/deep.txt"


def test_list_empty_directory(sandbox: Sandbox, workdir: str) -> None:
    assert sandbox.files.list(workdir) == []


def test_list_rejects_depth_below_one_locally(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(InvalidArgumentException, match="depth should be at least 1"):
        sandbox.files.list(workdir, depth=0)


def test_list_missing_and_not_a_directory(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.list(f"{workdir}/missing")
    sandbox.files.write(f"{workdir}/plain.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list(f"{workdir}/plain.txt")


# -- make_dir ---------------------------------------------------------------------------------


def test_make_dir_then_again(sandbox: Sandbox, workdir: str, envd: EnvdSandbox) -> None:
    assert sandbox.files.make_dir(f"{workdir}/a/b/c") is True
    assert sandbox.files.make_dir(f"{workdir}/a/b/c") is False
    for sub in ("a", "a/b", "a/b/c"):
        st = envd.host_path(f"{workdir}/{sub}").stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (USER_UID, USER_UID, 0o755)


def test_make_dir_relative(sandbox: Sandbox, workdir: str) -> None:
    assert sandbox.files.make_dir(f"{_rel(workdir)}/rel")
    assert sandbox.files.get_info(f"{workdir}/rel").type == FileType.DIR


def test_make_dir_over_file(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/file", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(f"{workdir}/file")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(f"{workdir}/file/below")


def test_make_dir_as_root(sandbox: Sandbox, workdir: str) -> None:
    assert sandbox.files.make_dir(f"{workdir}/owned-by-root", user="root")
    assert sandbox.files.get_info(f"{workdir}/owned-by-root").owner == "root"


# -- rename -----------------------------------------------------------------------------------


def test_rename(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/old.txt", "content")
    info = sandbox.files.rename(f"{workdir}/old.txt", f"{_rel(workdir)}/new.txt")
    assert info.path == f"{workdir}/new.txt"
    assert info.name == "new.txt"
    assert info.type == FileType.FILE
    assert not sandbox.files.exists(f"{workdir}/old.txt")
    assert sandbox.files.read(f"{workdir}/new.txt") == "content"


def test_rename_creates_destination_parents(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/d")
    info = sandbox.files.rename(f"{workdir}/d", f"{workdir}/x/y/d2")
    assert (info.path, info.type) == (f"{workdir}/x/y/d2", FileType.DIR)
    assert sandbox.files.get_info(f"{workdir}/x").owner == "user"


def test_rename_across_mounts(sandbox: Sandbox, workdir: str) -> None:
    # /tmp and /home are different mounts in the sandbox: rename(2) fails with EXDEV.
    name = f"/tmp/mv-{uuid.uuid4().hex[:8]}"
    sandbox.files.write(f"{name}/inner.txt", "moved")
    info = sandbox.files.rename(name, f"{workdir}/from-tmp")
    assert info.type == FileType.DIR
    assert sandbox.files.read(f"{workdir}/from-tmp/inner.txt") == "moved"
    assert not sandbox.files.exists(name)


def test_rename_missing(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename(f"{workdir}/ghost", f"{workdir}/other")


# -- remove -----------------------------------------------------------------------------------


def test_remove_file_tree_and_missing(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/tree/a/b.txt", "b")
    sandbox.files.write(f"{workdir}/single.txt", "s")
    sandbox.files.remove(f"{workdir}/single.txt")
    sandbox.files.remove(f"{_rel(workdir)}/tree")
    assert sandbox.files.list(workdir) == []
    sandbox.files.remove(f"{workdir}/never-existed")  # not an error


def test_remove_symlink_keeps_target(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/keep/file.txt", "kept")
    sandbox.commands.run(f"ln -s {workdir}/keep {workdir}/link")
    sandbox.files.remove(f"{workdir}/link")
    assert not sandbox.files.exists(f"{workdir}/link")
    assert sandbox.files.read(f"{workdir}/keep/file.txt") == "kept"


# -- identity and bad input -------------------------------------------------------------------


def test_unknown_user(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(AuthenticationException, match="nobody-here"):
        sandbox.files.list(workdir, user="nobody-here")  # type: ignore[arg-type]


def test_path_with_nul(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(InvalidArgumentException):
        sandbox.files.get_info(f"{workdir}/a\x00b")


def test_remove_of_empty_path_is_refused(envd: EnvdSandbox) -> None:
    # "" would mean the whole home directory.
    response = httpx.post(f"{envd.url}/filesystem.Filesystem/Remove", json={"path": ""},
                          headers=UNARY_HEADERS)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_argument"
    assert os.path.isdir(envd.host_path("/home/user"))


@pytest.mark.parametrize("body", [b"{not json", b'{"path": 5}', b"[]", b"\xff\xfe"])
def test_malformed_request_body(envd: EnvdSandbox, body: bytes) -> None:
    response = httpx.post(f"{envd.url}/filesystem.Filesystem/Stat", content=body,
                          headers=UNARY_HEADERS)
    assert 400 <= response.status_code < 500
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()
    assert isinstance(error["code"], str) and error["code"] != "internal"
    assert "Traceback" not in response.text


def test_unknown_watcher_id(envd: EnvdSandbox) -> None:
    response = httpx.post(f"{envd.url}/filesystem.Filesystem/GetWatcherEvents",
                          json={"watcherId": "w-nope"}, headers=UNARY_HEADERS)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


# -- async SDK --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_directory_operations(async_sandbox: AsyncSandbox, workdir: str) -> None:
    files = async_sandbox.files
    assert await files.make_dir(f"{workdir}/d/e") is True
    assert await files.make_dir(f"{workdir}/d/e") is False
    await files.write(f"{workdir}/d/e/f.txt", "async")
    assert [e.path for e in await files.list(workdir, depth=3)] == [
        f"{workdir}/d", f"{workdir}/d/e", f"{workdir}/d/e/f.txt",
    ]
    info = await files.rename(f"{workdir}/d/e/f.txt", f"{workdir}/g.txt")
    assert (info.path, info.size, info.permissions) == (f"{workdir}/g.txt", 5, "-rw-r--r--")
    assert await files.exists(f"{workdir}/g.txt")
    await files.remove(f"{workdir}/d")
    await files.remove(f"{workdir}/d")
    assert [e.name for e in await files.list(workdir)] == ["g.txt"]
    with pytest.raises(FileNotFoundException):
        await files.get_info(f"{workdir}/d")


# -- as the requesting user (issue 21, item 3) -------------------------------------------------


def test_rpcs_as_user_are_their_permission(
    sandbox: Sandbox, workdir: str, envd: EnvdSandbox
) -> None:
    """Every Filesystem RPC meets the user's permissions: /root is root's (0700) and a
    root-owned directory inside the user's workdir is not theirs to write into."""
    name = f"mine-{uuid.uuid4().hex[:6]}"
    sandbox.files.write(f"/root/{name}", "r", user="root")
    sandbox.files.make_dir(f"{workdir}/roots", user="root")
    sandbox.files.write(f"{workdir}/roots/f", "r", user="root")
    sandbox.files.write(f"{workdir}/mine", "u")
    denied = [
        lambda: sandbox.files.list("/root"),
        lambda: sandbox.files.get_info(f"/root/{name}"),
        lambda: sandbox.files.make_dir(f"/root/{name}-dir"),
        lambda: sandbox.files.make_dir(f"{workdir}/roots/sub"),
        lambda: sandbox.files.rename(f"{workdir}/mine", f"/root/{name}-moved"),
        lambda: sandbox.files.rename(f"{workdir}/roots/f", f"{workdir}/stolen"),
        lambda: sandbox.files.remove(f"/root/{name}"),
        lambda: sandbox.files.remove(f"{workdir}/roots/f"),
        lambda: sandbox.files.watch_dir("/root"),
    ]
    for number, attempt in enumerate(denied):
        with pytest.raises(SandboxException, match="PERMISSION_DENIED"):
            attempt()
            pytest.fail(f"attempt {number} was allowed")
    assert envd.host_path(f"/root/{name}").read_text() == "r"
    assert not envd.host_path(f"/root/{name}-dir").exists()
    assert not envd.host_path(f"/root/{name}-moved").exists()
    assert envd.host_path(f"{workdir}/roots/f").exists()
    # Root is unrestricted.
    assert name in {e.name for e in sandbox.files.list("/root", user="root")}
    sandbox.files.rename(f"{workdir}/roots/f", f"{workdir}/roots/g", user="root")
    sandbox.files.remove(f"/root/{name}", user="root")
    assert not envd.host_path(f"/root/{name}").exists()
    sandbox.files.remove(f"{workdir}/roots", user="root")  # the user could not


def test_what_a_user_creates_is_theirs(sandbox: Sandbox, workdir: str, envd: EnvdSandbox) -> None:
    sandbox.commands.run(f"mkdir -m 1777 {workdir}/shared", user="root")
    sandbox.files.make_dir(f"{workdir}/shared/a/b")
    sandbox.files.write(f"{workdir}/shared/a/b/f", "x")
    for sub in ("a", "a/b", "a/b/f"):
        st = envd.host_path(f"{workdir}/shared/{sub}").stat()
        assert (st.st_uid, st.st_gid) == (USER_UID, USER_UID), sub
