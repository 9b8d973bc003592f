"""A node on the fake runtime, chosen by config (``AENV_RUNTIME=fake``), driven through its API.

The node starts as any node does — the base template's memory image made by booting and
checkpointing a sandbox, warm and pre-created pools filled — with no runsc at all: each
sandbox's guest is runtime/fake_guest.py, answering envd's control endpoints in the
sandbox's real network slot. Through the E2B API: create (201, running), pause (204, paused;
written to disk at once, so the resume is a restore that meets ``/restored``), resume
(running), fork (children running), the SDK's command path through the proxy to the fake
guest (it says no command runs), kill (204, then 404). In both workspace modes (a disk
workspace's pause, fork and template image take the disk along through the same driver
calls). Nothing of runsc ever appears, and once the server stops no slot of its range and no
process naming its home is left.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from aenv.network import slots
from tests.conftest import free_port
from tests.server.harness import (
    API_KEY,
    NodeServer,
    cleanup_home,
    client_env,
    kill_all_sandboxes,
    kill_leaked,
    start_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_HOW = re.compile(r"(created|resumed) (\w+) \(([\w -]+)\)")


def _with_home(home: Path, argv_or_env: bytes) -> bool:
    return str(home).encode() in argv_or_env


def _processes_of(home: Path) -> list[tuple[int, str]]:
    """Processes naming ``home`` in their command line or environment (the server itself,
    and anything it started), as (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if _with_home(home, cmdline) or f"AENV_HOME={home}".encode() in environ.split(b"\0"):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _no_runsc(node: NodeServer) -> None:
    runsc = [(pid, cmd) for pid, cmd in _processes_of(node.home) if "runsc" in cmd]
    assert not runsc, runsc
    assert not (node.home / "runtime").exists()  # the gVisor driver's state: never made


def _slots_of(node: NodeServer) -> set[int]:
    first, last = int(node.env["AENV_NET_FIRST_INDEX"]), int(node.env["AENV_NET_LAST_INDEX"])
    return {i for i in slots.existing() if first <= i <= last}


def _state(api: httpx.Client, sandbox_id: str) -> str:
    response = api.get(f"/sandboxes/{sandbox_id}")
    assert response.status_code == 200, response.text
    state: str = response.json()["state"]
    return state


def _how(node: NodeServer, sandbox_id: str, verb: str) -> str:
    found = [how for v, sid, how in _HOW.findall(node.log()) if (v, sid) == (verb, sandbox_id)]
    return found[-1] if found else "?"


@pytest.fixture(params=["memory", "disk"])
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
         ) -> Iterator[NodeServer]:
    # A home of our own, so the harness does not seed it with gVisor's images (nor add the
    # fake's to the shared seed): this node makes its template image itself.
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    try:
        node = start_server(
            free_port(), home, runtime="fake", workspace=request.param, net_pool_size="2",
            warm_pool_size="1", precreate_pool_size="2", pause_hot_s="0")
    except BaseException:
        cleanup_home(home)
        raise
    for key, value in client_env(node).items():
        monkeypatch.setenv(key, value)
    try:
        yield node
    finally:
        try:
            kill_all_sandboxes()  # a failed test's too: their slots stay leased otherwise
        finally:
            node.stop()
        kill_leaked(node.home)
        if "Traceback" in node.log():
            print("server log contains tracebacks:\n" + node.log()[-8000:])
        # Nothing outlives the node: no slot of its range, no process naming its home.
        left_slots = _slots_of(node)
        left_processes = _processes_of(node.home)
        cleanup_home(node.home)
        assert not left_slots, f"slots left: {sorted(left_slots)}"
        assert not left_processes, f"processes left: {left_processes}"


def test_a_fake_runtime_node_creates_pauses_resumes_forks_and_kills(node: NodeServer) -> None:
    assert "memory image of template base made" in node.log()
    _no_runsc(node)
    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=60) as api:
        created = api.post("/sandboxes", json={"templateID": "base", "timeout": 300})
        assert created.status_code == 201, created.text
        sid = created.json()["sandboxID"]
        assert _state(api, sid) == "running"
        assert _how(node, sid, "created") in ("warm", "pre-created", "cold")

        # envd's /metrics, sampled through the slot from the fake guest.
        metrics = api.get(f"/sandboxes/{sid}/metrics")
        assert metrics.status_code == 200, metrics.text

        # The SDK's envd traffic goes through the node's proxy to the fake guest, which
        # answers the command's stream honestly: nothing ran.
        sbx = Sandbox.connect(sid)
        with pytest.raises(CommandExitException) as raised:
            sbx.commands.run("echo hi")
        assert raised.value.exit_code == 127 and "fake runtime" in raised.value.stderr

        paused = api.post(f"/sandboxes/{sid}/pause")
        assert paused.status_code == 204, paused.text
        assert _state(api, sid) == "paused"
        resumed = api.post(f"/sandboxes/{sid}/connect", json={"timeout": 300})
        assert resumed.status_code in (200, 201), resumed.text
        assert _state(api, sid) == "running"
        assert _how(node, sid, "resumed") in ("thawed", "restored")

        forked = api.post(f"/sandboxes/{sid}/fork", json={"count": 2, "timeout": 300})
        assert forked.status_code == 201, forked.text
        children = [entry["sandbox"]["sandboxID"] for entry in forked.json()]
        assert len(children) == 2 and sid not in children
        for child in children:
            assert _state(api, child) == "running"
        assert _state(api, sid) == "running"

        # The liveness probes reach every guest: none is called unresponsive.
        time.sleep(1.5)
        for sandbox_id in (sid, *children):
            assert not api.get(f"/sandboxes/{sandbox_id}").json().get("envdUnresponsive")

        _no_runsc(node)
        for sandbox_id in (sid, *children):
            assert api.delete(f"/sandboxes/{sandbox_id}").status_code == 204
            assert api.get(f"/sandboxes/{sandbox_id}").status_code == 404
        listed = api.get("/sandboxes")
        assert listed.status_code == 200 and listed.json() == []
    _no_runsc(node)
