"""Persistent volumes through the official SDK's ``Volume`` and ``volume_mounts``: the control
plane, the content API, data that outlives its sandbox, one writer and many readers, the size
as a quota, pause/resume and fork (docs/volumes.md)."""

from __future__ import annotations

import secrets
import uuid

import httpx
import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
    Template,
    Volume,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)
from e2b.sandbox.commands.command_handle import CommandExitException

from tests.server.harness import API_KEY, NodeServer


def _name() -> str:
    return f"vol-{secrets.token_hex(4)}"


def _api(server: NodeServer, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers={"X-API-KEY": API_KEY},
                         timeout=120, **kw)  # type: ignore[arg-type]


def _run(sbx: Sandbox, cmd: str, **kw: object) -> str:
    return sbx.commands.run(cmd, timeout=60, **kw).stdout  # type: ignore[arg-type]


def test_the_control_plane_and_the_content_api_round_trip(server: NodeServer) -> None:
    name = _name()
    vol = Volume.create(name)
    try:
        assert vol.name == name and uuid.UUID(vol.volume_id) and vol.token
        assert name in {v.name for v in Volume.list()}
        assert Volume.get_info(vol.volume_id).name == name
        # One name once, and E2B's rule for names.
        with pytest.raises(VolumeException, match="already exists"):
            Volume.create(name)
        with pytest.raises(VolumeException, match="Invalid volume name"):
            Volume.create("no/slashes")
        with pytest.raises(VolumeNotFoundException):
            Volume.get_info(str(uuid.uuid4()))

        stat = vol.write_file("/notes/a.txt", "hello", force=True)
        assert (stat.name, stat.path, stat.size, stat.type.value) == ("a.txt", "/notes/a.txt",
                                                                      5, "file")
        assert (stat.uid, stat.gid, stat.mode) == (9090, 9090, 0o666)
        assert vol.read_file("/notes/a.txt") == "hello"
        # Without force an existing file is refused (E2B's O_EXCL), with it replaced.
        with pytest.raises(VolumeException, match="409"):
            vol.write_file("/notes/a.txt", "again")
        vol.write_file("/notes/a.txt", b"\x00\x01binary", force=True)
        assert vol.read_file("/notes/a.txt", format="bytes") == b"\x00\x01binary"
        big = secrets.token_bytes(3 << 20)
        vol.write_file("/big.bin", big)
        assert vol.read_file("/big.bin", format="bytes") == big

        made = vol.make_dir("/notes/deep", mode=0o750)
        assert made.type.value == "directory" and made.mode == 0o750
        with pytest.raises(VolumeException, match="409"):
            vol.make_dir("/notes/deep")
        assert vol.make_dir("/notes/deep", force=True).path == "/notes/deep"
        assert [e.path for e in vol.list("/notes")] == ["/notes/a.txt", "/notes/deep"]
        vol.write_file("/notes/deep/b.txt", "b")
        assert [e.path for e in vol.list("/", depth=3)] == [
            "/big.bin", "/notes", "/notes/a.txt", "/notes/deep", "/notes/deep/b.txt"]
        changed = vol.update_metadata("/notes/a.txt", uid=1234, gid=4321, mode=0o600)
        assert (changed.uid, changed.gid, changed.mode) == (1234, 4321, 0o600)
        assert vol.exists("/notes/deep/b.txt") and not vol.exists("/missing")
        vol.remove("/notes")
        assert not vol.exists("/notes/a.txt")
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("/notes/a.txt")
        with pytest.raises(VolumePathNotFoundException):
            vol.remove("/missing")
        with pytest.raises(VolumeException, match="400"):
            vol.remove("/")
        # The volume's root is the root: no way above it.
        with pytest.raises(VolumePathNotFoundException):
            vol.read_file("../../../../etc/passwd")

        # The token is the volume's own: none, a forged one or another volume's is refused.
        other = Volume.create(_name())
        try:
            foreign = Volume(other.volume_id, other.name, vol.token)
            with pytest.raises(AuthenticationException):
                foreign.read_file("/big.bin")
            forged = Volume(vol.volume_id, name, vol.token[:-4] + "0000")
            with pytest.raises(AuthenticationException):
                forged.exists("/big.bin")
        finally:
            assert Volume.destroy(other.volume_id)
    finally:
        assert Volume.destroy(vol.volume_id)
    assert not Volume.destroy(vol.volume_id)
    assert name not in {v.name for v in Volume.list()}
    # The name is free again.
    assert Volume.destroy(Volume.create(name).volume_id)


def test_data_written_in_one_sandbox_is_read_in_the_next(server: NodeServer) -> None:
    vol = Volume.create(_name())
    try:
        first = Sandbox.create(timeout=120, volume_mounts={"/mnt/data": vol})
        try:
            assert first.get_info().volume_mounts == [{"name": vol.name,
                                                       "path": "/mnt/data"}]
            _run(first, "echo from-first > /mnt/data/kept.txt && mkdir -p /mnt/data/d && "
                        "head -c 100000 /dev/urandom > /mnt/data/d/blob && "
                        "sha256sum /mnt/data/d/blob | cut -c1-64 > /mnt/data/d/sum")
            # The content API reads what the sandbox wrote, while it runs.
            assert vol.read_file("/kept.txt") == "from-first\n"
            # ...and may not write while a sandbox has it read-write.
            with pytest.raises(VolumeException, match="409"):
                vol.write_file("/x", "y")
            # A volume in use is not deleted.
            assert _api(server, "DELETE", f"/volumes/{vol.volume_id}").status_code == 409
        finally:
            first.kill()
        vol.write_file("/from-api.txt", "api")
        second = Sandbox.create(timeout=120, volume_mounts={"/data": vol.name})
        try:
            assert _run(second, "cat /data/kept.txt /data/from-api.txt") == "from-first\napi"
            assert _run(second, "sha256sum /data/d/blob | cut -c1-64") == _run(
                second, "cat /data/d/sum")
        finally:
            second.kill()
    finally:
        Volume.destroy(vol.volume_id)


def test_one_writer_many_readers_and_read_only_is_enforced(server: NodeServer) -> None:
    vol = Volume.create(_name())
    vol.write_file("/shared.txt", "v1")
    writer = Sandbox.create(timeout=120, volume_mounts={"/vol": vol})
    reader_id = None
    try:
        with pytest.raises(SandboxException, match="read-write by sandbox"):
            Sandbox.create(timeout=60, volume_mounts={"/vol": vol})
        made = _api(server, "POST", "/sandboxes", json={
            "templateID": "base", "timeout": 120,
            "volumeMounts": [{"name": vol.name, "path": "/vol", "readOnly": True}]})
        assert made.status_code == 201, made.text
        reader_id = made.json()["sandboxID"]
        reader = Sandbox.connect(reader_id)
        assert _run(reader, "cat /vol/shared.txt") == "v1"
        for user in ("user", "root"):
            with pytest.raises(CommandExitException, match="Read-only"):
                _run(reader, "echo x > /vol/nope.txt", user=user)
            with pytest.raises(CommandExitException):
                _run(reader, "mount -o remount,rw /vol && echo x > /vol/nope.txt", user=user)
        assert not vol.exists("/nope.txt")
        _run(writer, "echo v2 > /vol/shared.txt")
        assert vol.read_file("/shared.txt") == "v2\n"
    finally:
        writer.kill()
        if reader_id:
            _api(server, "DELETE", f"/sandboxes/{reader_id}")
        Volume.destroy(vol.volume_id)


def test_bad_mounts_get_e2b_errors(server: NodeServer) -> None:
    vol = Volume.create(_name())
    try:
        cases = {
            "missing": [{"name": "no-such-volume-here", "path": "/a"}],
            "relative": [{"name": vol.name, "path": "a/b"}],
            "dots": [{"name": vol.name, "path": "/a/../b"}],
            "twice": [{"name": vol.name, "path": "/a"}, {"name": vol.name, "path": "/a"}],
            "proc": [{"name": vol.name, "path": "/proc/x"}],
            "root": [{"name": vol.name, "path": "/"}],
        }
        for why, mounts in cases.items():
            r = _api(server, "POST", "/sandboxes",
                     json={"templateID": "base", "volumeMounts": mounts})
            assert r.status_code == 400, (why, r.text)
            assert r.json()["message"].startswith("invalid mounts:"), (why, r.text)
        r = _api(server, "POST", "/sandboxes",
                 json={"templateID": "base", "volumeMounts": cases["missing"]})
        assert "volume mount #0: volume 'no-such-volume-here' not found" in r.json()["message"]
        five = [{"name": vol.name, "path": f"/v{i}", "readOnly": True} for i in range(5)]
        r = _api(server, "POST", "/sandboxes", json={"templateID": "base", "volumeMounts": five})
        assert r.status_code == 400 and "at most 4 volumes" in r.json()["message"], r.text
        # A path the image has a file at: the sandbox cannot take it, and is not left over.
        before = {s["sandboxID"] for s in _api(server, "GET", "/sandboxes").json()}
        r = _api(server, "POST", "/sandboxes", json={
            "templateID": "base", "volumeMounts": [{"name": vol.name, "path": "/etc/passwd"}]})
        assert r.status_code == 400, r.text
        assert "/etc/passwd exists and is not a directory" in r.json()["message"]
        assert {s["sandboxID"] for s in _api(server, "GET", "/sandboxes").json()} == before
        # The size is the quota: the sandbox gets ENOSPC and lives on.
        small = _api(server, "POST", "/volumes", json={"name": _name(), "sizeMB": 16})
        assert small.status_code == 201, small.text
        tiny = Volume.connect(small.json()["volumeID"])
        sbx = Sandbox.create(timeout=120, volume_mounts={"/small": tiny})
        try:
            with pytest.raises(CommandExitException, match="No space left"):
                _run(sbx, "head -c 40000000 /dev/zero > /small/fill")
            assert _run(sbx, "echo alive") == "alive\n"
        finally:
            sbx.kill()
        with pytest.raises(VolumeException, match="507"):
            tiny.write_file("/more", secrets.token_bytes(40 << 20), force=True)
        Volume.destroy(tiny.volume_id)
    finally:
        Volume.destroy(vol.volume_id)


def test_a_volume_survives_pause_and_resume_and_fork_children_read_it(
    server: NodeServer,
) -> None:
    vol = Volume.create(_name())
    sbx = Sandbox.create(timeout=300, volume_mounts={"/work": vol})
    children: list[str] = []
    try:
        _run(sbx, "echo before > /work/state.txt")
        sbx.pause()
        assert vol.read_file("/state.txt") == "before\n"
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert _run(sbx, "cat /work/state.txt") == "before\n"
        _run(sbx, "echo after >> /work/state.txt")
        forked = _api(server, "POST", f"/sandboxes/{sbx.sandbox_id}/fork",
                      json={"count": 2, "timeout": 120})
        assert forked.status_code == 201, forked.text
        children = [e["sandbox"]["sandboxID"] for e in forked.json()]
        for child_id in children:
            child = Sandbox.connect(child_id)
            assert _run(child, "cat /work/state.txt") == "before\nafter\n"
            with pytest.raises(CommandExitException, match="Read-only"):
                _run(child, "echo child > /work/state.txt")
            info = _api(server, "GET", f"/sandboxes/{child_id}").json()
            assert info["volumeMounts"] == [{"name": vol.name, "path": "/work",
                                             "readOnly": True}]
        # The parent still writes.
        _run(sbx, "echo parent >> /work/state.txt")
        # A snapshot's sandboxes mount the volume again, read-only, and see it as it is now.
        snapshot = sbx.create_snapshot()
        from_snapshot = Sandbox.create(snapshot.snapshot_id, timeout=120)
        children.append(from_snapshot.sandbox_id)
        assert _run(from_snapshot, "cat /work/state.txt") == "before\nafter\nparent\n"
        with pytest.raises(CommandExitException, match="Read-only"):
            _run(from_snapshot, "echo snap > /work/state.txt", user="root")
        assert from_snapshot.get_info().volume_mounts == [{"name": vol.name, "path": "/work"}]
    finally:
        for child_id in children:
            _api(server, "DELETE", f"/sandboxes/{child_id}")
        sbx.kill()
    assert vol.read_file("/state.txt") == "before\nafter\nparent\n"
    Volume.destroy(vol.volume_id)


def test_a_template_with_a_start_command_keeps_it_running_beside_its_volumes(
    server: NodeServer,
) -> None:
    """Sandboxes with volumes are restored from their template's memory image like any other
    (the image has spare mount slots, envd binds them where asked): the start command, which
    ran before the image was taken, runs in them."""
    name = f"tpl-vol-{secrets.token_hex(3)}"
    Template.build(
        Template().from_template("base").set_start_cmd(
            "while true; do date +%s%N > /tmp/a.new; mv /tmp/a.new /tmp/alive; sleep 0.5; done",
            "test -s /tmp/alive"),
        name)
    vol = Volume.create(_name())
    other = Volume.create(_name())
    other.write_file("/hello.txt", "ro")
    other.make_dir("/nested")  # a read-only volume's mount points must be there already
    sbx = Sandbox.create(name, timeout=120, volume_mounts={"/home/user/data": vol})
    try:
        first = _run(sbx, "cat /tmp/alive")
        assert _run(sbx, "sleep 1.2; cat /tmp/alive") != first
        _run(sbx, "echo written > /home/user/data/out.txt")
        assert vol.read_file("/out.txt") == "written\n"
        # A reader beside it, from the same image.
        made = _api(server, "POST", "/sandboxes", json={
            "templateID": name, "timeout": 120,
            "volumeMounts": [{"name": other.name, "path": "/srv/ro", "readOnly": True},
                             {"name": vol.name, "path": "/srv/ro/nested", "readOnly": True}]})
        assert made.status_code == 201, made.text
        reader = Sandbox.connect(made.json()["sandboxID"])
        try:
            assert _run(reader, "cat /srv/ro/hello.txt /srv/ro/nested/out.txt") == "rowritten\n"
            with pytest.raises(CommandExitException, match="Read-only"):
                _run(reader, "echo x > /srv/ro/x", user="root")
            # Unused slots show nothing and take nothing.
            assert _run(reader, "ls -A /opt/aenv/volumes/3") == ""
            with pytest.raises(CommandExitException, match="Read-only"):
                _run(reader, "echo x > /opt/aenv/volumes/3/x", user="root")
        finally:
            reader.kill()
    finally:
        sbx.kill()
        Volume.destroy(vol.volume_id)
        Volume.destroy(other.volume_id)
        _api(server, "DELETE", f"/templates/{name}")
