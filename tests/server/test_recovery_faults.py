"""Recovery never stops the node, and two nodes never recover or sweep the same things.

- A second server on the same ``AENV_HOME``, or with a network-slot range overlapping a
  running node's, refuses to start with one clear line and touches nothing of the first,
  which goes on serving; a disjoint range on another home starts.
- A restart after the machine was sabotaged by hand under some sandboxes (a host veth
  deleted, the instance JSON in the store corrupted, a paused sandbox's files unmounted and
  deleted, a running sandbox's rootfs unmounted) comes up healthy: the untouched sandboxes
  survive and work, each sabotaged one either works or is gone (404), and nothing of a gone
  one is left (runtime, rootfs, slot).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException

from tests.conftest import free_port
from tests.server.harness import (
    REPO,
    NodeServer,
    cleanup_home,
    client_env,
    kill_all_sandboxes,
    kill_leaked,
    runsc_of,
    start_server,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


@pytest.fixture
def sdk_env() -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _point_sdk_at(server: NodeServer) -> None:
    os.environ.update(client_env(server))
    os.environ.pop("E2B_DEBUG", None)


def _second(env: dict[str, str], **changes: str) -> subprocess.CompletedProcess[str]:
    """Start a server with ``env`` changed by ``changes``; it must exit on its own."""
    return subprocess.run(
        [sys.executable, "-m", "aenv.server"],
        env={**env, **changes},
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _slots(server: NodeServer) -> tuple[int, int]:
    return int(server.env["AENV_NET_FIRST_INDEX"]), int(server.env["AENV_NET_LAST_INDEX"])


def _finish(*servers: NodeServer) -> list[int]:
    leaked: list[int] = []
    for server in servers:
        if server.process.poll() is None:
            _point_sdk_at(server)
            try:
                kill_all_sandboxes()
            finally:
                server.stop()
        leaked += kill_leaked(server.home)
        cleanup_home(server.home)
    return leaked


def test_second_node_on_the_same_home_or_slots_refused(sdk_env: None, tmp_path: Path) -> None:
    first = start_server(free_port())
    others: list[NodeServer] = []
    try:
        _point_sdk_at(first)
        sbx = Sandbox.create(timeout=300)
        sbx.files.write("/home/user/mark", "first")
        first_slot, last_slot = _slots(first)

        # The same home (another port, so only the lock can stop it).
        same_home = _second(first.env, AENV_LISTEN=f"127.0.0.1:{free_port()}")
        assert same_home.returncode == 1, same_home.stderr
        assert same_home.stderr.strip().splitlines() == [
            f"aenv: another aenv node (pid {first.process.pid}) is using "
            f"AENV_HOME={first.home}; stop it first"
        ]

        # Another home, a slot range overlapping the first node's.
        overlap_home = tmp_path / "overlap-home"
        overlap = _second(
            first.env,
            AENV_HOME=str(overlap_home),
            AENV_LISTEN=f"127.0.0.1:{free_port()}",
            AENV_NET_FIRST_INDEX=str(first_slot + 50),
            AENV_NET_LAST_INDEX=str(last_slot + 50),
        )
        assert overlap.returncode == 1, overlap.stderr
        assert overlap.stderr.strip().splitlines() == [
            f"aenv: network slots {first_slot + 50}..{last_slot + 50} overlap those of another "
            f"aenv node (pid {first.process.pid}, slots {first_slot}..{last_slot}) on this "
            "machine; give this node a disjoint AENV_NET_FIRST_INDEX..AENV_NET_LAST_INDEX"
        ]
        # It took its home's lock and went no further.
        assert sorted(p.name for p in overlap_home.iterdir()) == ["node.lock"]

        # The first node never noticed: its sandbox and its slots are intact, it serves.
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("/home/user/mark") == "first"
        assert again.commands.run("echo ok").stdout == "ok\n"
        assert "Traceback" not in first.log()

        # A disjoint range (the harness's next: right next to it unless the worker's block
        # wraps), on its own home: starts and serves.
        others.append(start_server(free_port()))
        assert int(others[0].env["AENV_NET_FIRST_INDEX"]) > last_slot or \
            int(others[0].env["AENV_NET_LAST_INDEX"]) < int(first.env["AENV_NET_FIRST_INDEX"])
        _point_sdk_at(others[0])
        neighbour = Sandbox.create(timeout=300)
        assert neighbour.commands.run("echo hi").stdout == "hi\n"
        _point_sdk_at(first)
        assert Sandbox.connect(sbx.sandbox_id).commands.run("echo ok").stdout == "ok\n"
    finally:
        leaked = _finish(first, *others)
    assert not leaked, f"runsc processes outlived the servers: {leaked}"


# -- sabotage under a stopped node, then restart ---------------------------------------------


def _instance(home: Path, sandbox_id: str) -> dict[str, Any]:
    with sqlite3.connect(home / "state.db") as db:
        (raw,) = db.execute(
            "SELECT instance FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
        ).fetchone()
    data: dict[str, Any] = json.loads(raw)
    return data


def _wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _mounted(path: Path) -> bool:
    return any(
        line.split(" ")[4] == str(path)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def test_restart_survives_sabotaged_sandboxes(sdk_env: None) -> None:
    server = start_server(free_port(), pause_hot_s="0", warm_pool_size="0")
    home = server.home
    try:
        _point_sdk_at(server)
        names = ["ok1", "ok2", "veth", "json", "files", "umount"]
        sbx = {name: Sandbox.create(timeout=600, metadata={"role": name}) for name in names}
        for name, s in sbx.items():
            s.files.write("/home/user/mark", name)
        assert sbx["files"].pause()
        files_id = sbx["files"].sandbox_id
        _wait(
            "the pause to reach disk and the repository",
            lambda: "image" in _instance(home, files_id) and (home / "paused" / files_id).is_dir()
            and _instance(home, files_id).get("published") is True,
        )
        slot_of = {n: _instance(home, s.sandbox_id).get("slot") for n, s in sbx.items()}
        server.kill9()

        # The sabotage, as a person with a shell might do it.
        veth = slot_of["veth"]
        assert veth is not None
        subprocess.run(["ip", "link", "del", veth["host_ifname"]], check=True)
        with sqlite3.connect(home / "state.db") as db:
            db.execute(
                "UPDATE sandboxes SET instance = ? WHERE sandbox_id = ?",
                ('{"slot": {"index": 4', sbx["json"].sandbox_id),
            )
        # A paused sandbox keeps its rootfs mounted: unmount it, then lose its files (its disk
        # image with disk workspaces, the default; its upper directory in memory mode).
        files_rootfs = home / "sandboxes" / files_id / "rootfs"
        if _mounted(files_rootfs):
            subprocess.run(["umount", str(files_rootfs)], check=True)
        if server.env.get("AENV_WORKSPACE", "disk") == "disk":
            # An attached disk outlives its file (the loop device holds it): detach it first.
            disk_mount = home / "workspaces-mnt" / files_id
            if _mounted(disk_mount):
                subprocess.run(["umount", str(disk_mount)], check=True)
            (home / "workspaces" / f"{files_id}.img").unlink()
        else:
            shutil.rmtree(home / "sandboxes" / files_id / "upper")
        umount_rootfs = home / "sandboxes" / sbx["umount"].sandbox_id / "rootfs"
        subprocess.run(["umount", "--lazy", str(umount_rootfs)], check=True)

        env = server.env
        server = start_server(
            server.port,
            home=home,
            pause_hot_s="0",
            warm_pool_size="0",
            net_first_index=env["AENV_NET_FIRST_INDEX"],
            net_last_index=env["AENV_NET_LAST_INDEX"],
        )
        log = server.log()
        listed = {i.sandbox_id for i in Sandbox.list().next_items()}

        # The untouched ones survive and work.
        for name in ("ok1", "ok2"):
            assert sbx[name].sandbox_id in listed, log[-4000:]
            again = Sandbox.connect(sbx[name].sandbox_id)
            assert again.files.read("/home/user/mark") == name
            assert again.commands.run("echo ok").stdout == "ok\n"

        # The sabotaged ones whose state cannot be made whole here are gone from this node,
        # with nothing left of them on it.
        for name in ("veth", "json", "files"):
            sid = sbx[name].sandbox_id
            assert sid not in listed, (name, log[-4000:])
            assert f"sandbox {sid} is gone" in log, name
            assert not (home / "sandboxes" / sid).exists(), name
            assert not (home / "paused" / sid).exists(), name
            assert not runsc_of(home, sid), name
        for name in ("veth", "json"):
            with pytest.raises(NotFoundException):
                Sandbox.connect(sbx[name].sandbox_id)
        # The paused one was published to the repository before its local files were lost:
        # the repository has all of it (memory image, and disk if it has one), so a connect
        # brings it back from there, files included.
        revived = Sandbox.connect(sbx["files"].sandbox_id)
        assert revived.files.read("/home/user/mark") == "files"
        for name in ("veth", "json"):
            slot = slot_of[name]
            assert slot is not None
            assert not Path("/run/netns", slot["netns"]).exists(), name
            assert not Path("/sys/class/net", slot["host_ifname"]).exists(), name

        # The one whose rootfs was unmounted: re-mounted and working, or gone; never listed
        # and broken.
        sid = sbx["umount"].sandbox_id
        if sid in listed:
            again = Sandbox.connect(sid)
            assert again.commands.run("echo ok").stdout == "ok\n"
            assert _mounted(umount_rootfs)
        else:
            with pytest.raises(NotFoundException):
                Sandbox.connect(sid)
            assert not runsc_of(home, sid)

        # The node works for new sandboxes too.
        fresh = Sandbox.create(timeout=300)
        assert fresh.commands.run("echo new").stdout == "new\n"
    finally:
        leaked = _finish(server)
    assert not leaked, f"runsc processes outlived the server: {leaked}"
