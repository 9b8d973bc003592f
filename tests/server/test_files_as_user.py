"""File operations as the requesting user, and file metadata, on a real node (gVisor, disk
workspaces: the default) through the official SDK (issue 21, items 3 and 10).

- ``user`` cannot read ``/etc/shadow``, write ``../../../etc/x``, or write through a symlink to
  ``/etc/shadow`` (403 / ``permission_denied``, nothing changed); Filesystem RPCs meet the
  same permissions; what ``user`` writes is theirs; root may do all of it;
- metadata written with a file comes back from ``get_info`` and ``list``, follows a rename,
  is replaced by the next write, and survives a pause/resume and a fork (the disk workspace's
  filesystem has no xattrs under gVisor: envd keeps it in its metadata store).
"""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox, SandboxException

from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]


def test_file_operations_run_as_the_user(sandbox: Sandbox) -> None:
    shadow = sandbox.files.read("/etc/shadow", user="root")
    with pytest.raises(SandboxException, match="403"):
        sandbox.files.read("/etc/shadow", user="user")

    with pytest.raises(SandboxException, match="403"):
        sandbox.files.write("../../../etc/x", "x", user="user")
    assert not sandbox.files.exists("/etc/x", user="root")

    sandbox.commands.run("ln -s /etc/shadow ~/shadow-link", user="user")
    for octet in (False, True):
        with pytest.raises(SandboxException, match="403"):
            sandbox.files.write("shadow-link", "owned", user="user", use_octet_stream=octet)
    assert sandbox.files.read("/etc/shadow", user="root") == shadow

    for attempt in (
        lambda: sandbox.files.list("/root", user="user"),
        lambda: sandbox.files.make_dir("/etc/new-dir", user="user"),
        lambda: sandbox.files.remove("/etc/hostname", user="user"),
        lambda: sandbox.files.rename("/etc/passwd", "/home/user/passwd", user="user"),
    ):
        with pytest.raises(SandboxException, match="PERMISSION_DENIED"):
            attempt()
    assert sandbox.files.exists("/etc/passwd", user="root")

    info = sandbox.files.write("sub/dir/mine.txt", "mine", user="user")
    assert info.path == "/home/user/sub/dir/mine.txt"
    owners = sandbox.commands.run("stat -c %U:%G:%a ~/sub ~/sub/dir ~/sub/dir/mine.txt").stdout
    assert owners.split() == ["user:user:755", "user:user:755", "user:user:644"]

    # Root is unrestricted.
    sandbox.files.write("../../../etc/x", "x", user="root")
    assert sandbox.files.get_info("/etc/x").owner == "root"
    assert sandbox.files.list("/root", user="root") is not None


def _fork(node: NodeServer, sandbox_id: str) -> str:
    response = httpx.post(
        f"{node.url}/sandboxes/{sandbox_id}/fork",
        json={"count": 1},
        headers={"X-API-KEY": API_KEY},
        timeout=300,
    )
    assert response.status_code == 201, response.text
    return str(response.json()[0]["sandbox"]["sandboxID"])


def test_metadata_round_trips_on_a_disk_workspace(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        metadata = {"author": "mish", "stage": "one"}
        assert sbx.files.write("m/a.txt", "a", metadata=metadata).metadata == metadata
        assert sbx.files.get_info("m/a.txt").metadata == metadata
        assert [(e.name, e.metadata) for e in sbx.files.list("m")] == [("a.txt", metadata)]
        sbx.files.rename("m/a.txt", "m/b.txt")
        assert sbx.files.get_info("m/b.txt").metadata == metadata
        sbx.files.write("m/c.txt", "c", metadata={"Stage": "two"}, use_octet_stream=True)
        sbx.files.write("m/d.txt", "d", metadata={"x": "y"})
        assert sbx.files.write("m/d.txt", "d2").metadata is None
        assert sbx.files.get_info("m/d.txt").metadata is None
        sbx.files.write("m/e.txt", "e", metadata={"gone": "soon"})
        sbx.files.remove("m/e.txt")
        sbx.commands.run("echo e > ~/m/e.txt")
        assert sbx.files.get_info("m/e.txt").metadata is None

        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert sbx.files.get_info("m/b.txt").metadata == metadata
        assert sbx.files.get_info("m/c.txt").metadata == {"stage": "two"}

        child = Sandbox.connect(_fork(server, sbx.sandbox_id), timeout=300)
        try:
            assert child.files.get_info("m/b.txt").metadata == metadata
            child.files.write("m/b.txt", "child", metadata={"who": "child"})
            assert child.files.get_info("m/b.txt").metadata == {"who": "child"}
        finally:
            child.kill()
        assert sbx.files.get_info("m/b.txt").metadata == metadata
    finally:
        sbx.kill()
