"""Pre-created sandboxes (``orchestrator/precreated.py``) through the official SDK.

A node keeps sandboxes ``runsc create``d ahead for the shape of the last fork (before any
fork: the base template's). A fork takes them for as many children as it finds and restores
the rest afresh; both kinds of child must carry the parent's files and running process, have
their own identity, and be left behind by nothing once killed. With disk workspaces a fork
child's disk is made ahead on the clone the parent's previous fork kept, and used while the
parent's files did not change.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from aenv.orchestrator.pool_demand import BURST_S
from tests.counter import COUNT
from tests.server.harness import API_KEY, NodeServer, leaked_sandboxes, serving, start_server

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(600)]

_PRECREATED = re.compile(r"created sandbox (\w+) \(pid \d+\) in slot")
_CHILD = re.compile(r"created (\w+) \((warm|pre-created|cold)\)")
def _wait_precreated(node: NodeServer, at_least: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_PRECREATED.findall(node.log())) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} sandboxes were pre-created"
        time.sleep(0.2)
    # The log line comes before the sandbox is in the pool: wait until none is being made
    # (a fixed pause was too short on a loaded CI host).
    while httpx.get(f"{node.url}/node/pools", headers={"X-API-KEY": API_KEY},
                    timeout=30).json()["making"]:
        assert time.monotonic() < deadline, "the pool kept making sandboxes"
        time.sleep(0.1)


def _how_created(node: NodeServer, sandbox_ids: list[str]) -> dict[str, str]:
    found = {sid: how for sid, how in _CHILD.findall(node.log())}
    return {sid: found.get(sid, "?") for sid in sandbox_ids}


def _check_child(child: Sandbox, parent_id: str, nonce: str) -> None:
    assert child.sandbox_id != parent_id
    assert child.files.read("/home/user/nonce") == nonce
    first = int(child.files.read("/tmp/count").strip())
    # The process runs on (a loaded 2-core CI machine may not run it for a while).
    deadline = time.monotonic() + 10
    while int(child.files.read("/tmp/count").strip()) <= first:
        assert time.monotonic() < deadline, f"{child.sandbox_id}: the counter stopped"
        time.sleep(0.2)
    child.files.write("/home/user/own", child.sandbox_id)
    assert child.commands.run("cat /home/user/own").stdout == child.sandbox_id


def test_fork_draws_from_the_pool_then_restores_the_rest_afresh_and_the_pool_grows() -> None:
    """A pool that keeps 3 serves 3 of a fork of 5 and restores 2 afresh; that demand grows
    it to 5 (``pool_demand.py``), so the next fork of 5 finds all of its children made."""
    with serving(workspace="memory", warm_pool_size="0", precreate_pool_size="3",
                 precreate_pool_max="6") as node:
        _wait_precreated(node, 3)
        parent = Sandbox.create(timeout=300)  # takes one: the pool holds the base's shape
        assert _how_created(node, [parent.sandbox_id]) == {parent.sandbox_id: "pre-created"}
        _wait_precreated(node, 4)
        nonce = f"n-{time.time_ns()}"
        parent.files.write("/home/user/nonce", nonce)
        parent.commands.run(COUNT)
        # Apart from the parent's create by more than BURST_S: demands within it add up.
        time.sleep(BURST_S + 0.2)
        children = parent.fork(count=5, timeout=120)
        assert all(isinstance(c, Sandbox) for c in children), children
        how = _how_created(node, [c.sandbox_id for c in children])
        assert sorted(how.values()) == ["cold", "cold", "pre-created", "pre-created",
                                        "pre-created"], how
        for child in children:
            _check_child(child, parent.sandbox_id, nonce)
        # Each child's files are its own.
        assert children[0].files.read("/home/user/own") == children[0].sandbox_id
        assert not parent.files.exists("/home/user/own")

        # The pool refills for the fork's shape once nothing runs, now 5 of them; a second
        # fork of 5 uses them all.
        assert "pre-created pool: keeping 5" in node.log()
        _wait_precreated(node, 9)
        again = parent.fork(count=5, timeout=120)
        how = _how_created(node, [c.sandbox_id for c in again])
        assert set(how.values()) == {"pre-created"}, how
        for child in again:
            _check_child(child, parent.sandbox_id, nonce)
        for sbx in [parent, *children, *again]:
            sbx.kill()
    assert not leaked_sandboxes(node.home)


def test_with_an_empty_pool_a_fork_restores_every_child_afresh() -> None:
    with serving(workspace="memory", warm_pool_size="0", precreate_pool_size="0") as node:
        parent = Sandbox.create(timeout=300)
        nonce = f"n-{time.time_ns()}"
        parent.files.write("/home/user/nonce", nonce)
        parent.commands.run(COUNT)
        time.sleep(0.3)
        children = parent.fork(count=2, timeout=120)
        how = _how_created(node, [c.sandbox_id for c in children])
        assert set(how.values()) == {"cold"}, how
        for child in children:
            _check_child(child, parent.sandbox_id, nonce)
        for sbx in [parent, *children]:
            sbx.kill()
    assert not leaked_sandboxes(node.home)


def test_disk_workspaces_pre_create_fork_children_while_the_parent_keeps_its_files() -> None:
    """With disk workspaces the pool serves template creates, and fork children from the
    second fork of a parent on: the first fork keeps its clone of the parent's disk and the
    pool makes sandboxes on it; a fork finds them only while the parent's files are as they
    were (``orchestrator/fork_seeds.py``), and after a write its children see the write."""
    with serving(workspace="disk", warm_pool_size="0", precreate_pool_size="2") as node:
        _wait_precreated(node, 2)
        created = [Sandbox.create(timeout=300) for _ in range(3)]
        how = _how_created(node, [s.sandbox_id for s in created])
        # The pool may refill between two creates: at least its two were used.
        assert list(how.values()).count("pre-created") >= 2, how
        for sbx in created:
            sbx.files.write("/home/user/mine", sbx.sandbox_id)
            assert sbx.commands.run("cat /home/user/mine").stdout == sbx.sandbox_id
        parent = created[0]
        parent.commands.run(COUNT)
        nonce = f"n-{time.time_ns()}"
        parent.files.write("/home/user/nonce", nonce)
        time.sleep(0.3)
        made = len(_PRECREATED.findall(node.log()))
        children = parent.fork(count=2, timeout=120)
        how = _how_created(node, [c.sandbox_id for c in children])
        assert set(how.values()) == {"cold"}, how  # nothing was made on this disk yet
        for child in children:
            _check_child(child, parent.sandbox_id, nonce)

        _wait_precreated(node, made + 2)  # on the kept clone of the parent's disk
        made = len(_PRECREATED.findall(node.log()))
        again = parent.fork(count=2, timeout=120)
        how = _how_created(node, [c.sandbox_id for c in again])
        assert set(how.values()) == {"pre-created"}, how
        for child in again:
            _check_child(child, parent.sandbox_id, nonce)
            # A disk of its own: what one child writes, no other sees.
            assert child.files.read("/home/user/own") == child.sandbox_id

        _wait_precreated(node, made + 2)  # the pool refilled
        parent.files.write("/home/user/later", "written after the last fork")
        third = parent.fork(count=2, timeout=120)
        how = _how_created(node, [c.sandbox_id for c in third])
        assert set(how.values()) == {"cold"}, how  # the parent's disk changed
        for child in third:
            assert child.files.read("/home/user/later") == "written after the last fork"
            _check_child(child, parent.sandbox_id, nonce)
        kept = list(node.home.glob(f"workspaces/clones/{parent.sandbox_id}.*.fork.img"))
        assert len(kept) == 1, kept  # one per parent: the last fork's
        for sbx in [*created, *children, *again, *third]:
            sbx.kill()
        deadline = time.monotonic() + 10
        while kept[0].exists():  # dropped after the parent's kill answered
            assert time.monotonic() < deadline, "a kept seed outlived its parent"
            time.sleep(0.2)
    assert not leaked_sandboxes(node.home)


def test_creates_from_a_snapshot_take_sandboxes_pre_created_in_its_shape() -> None:
    """With disk workspaces (the default): the first create from a snapshot asks the pool for
    the snapshot's shape, the next ones are restored into sandboxes made ahead, each with the
    snapshot's files and running processes and a disk of its own; deleting the snapshot puts
    the pool back on the default template's shape."""
    with serving(workspace="disk", warm_pool_size="0", precreate_pool_size="3") as node:
        source = Sandbox.create(timeout=300)
        nonce = f"n-{time.time_ns()}"
        source.files.write("/home/user/nonce", nonce)
        source.commands.run(COUNT)
        time.sleep(0.3)
        snapshot = source.create_snapshot()
        first = Sandbox.create(snapshot.snapshot_id, timeout=120)
        assert _how_created(node, [first.sandbox_id]) == {first.sandbox_id: "cold"}
        made = len(_PRECREATED.findall(node.log()))
        _wait_precreated(node, made + 3)  # three more, in the snapshot's shape
        group = [Sandbox.create(snapshot.snapshot_id, timeout=120) for _ in range(3)]
        how = _how_created(node, [s.sandbox_id for s in group])
        assert set(how.values()) == {"pre-created"}, how
        for sbx in [first, *group]:
            _check_child(sbx, source.sandbox_id, nonce)
        assert not source.files.exists("/home/user/own")
        for sbx in [first, *group]:
            sbx.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)
        source.kill()
        plain = Sandbox.create(timeout=120)  # wakes the pool, which finds the image gone
        deadline = time.monotonic() + 60
        while "back to the default template's shape" not in node.log():
            assert time.monotonic() < deadline, "the pool kept the deleted snapshot's shape"
            time.sleep(0.2)
        plain.kill()
    assert not leaked_sandboxes(node.home)


def test_a_create_that_finds_every_slot_taken_gets_one_a_waiting_sandbox_held() -> None:
    """The pool waits with sandboxes of a snapshot's shape (each holding a network slot);
    creates of another template that find every slot taken are served with the slots of
    those, instead of 429 (found by the waves bench: a burst of 100 never finished)."""
    with serving(workspace="disk", warm_pool_size="0", precreate_pool_size="3",
                 net_pool_size="0", slot_count="8") as node:
        source = Sandbox.create(timeout=300)
        snapshot = source.create_snapshot()
        child = Sandbox.create(snapshot.snapshot_id, timeout=120)
        made = len(_PRECREATED.findall(node.log()))
        _wait_precreated(node, made + 3)  # 2 running + 3 waiting: 3 slots free
        plain = [Sandbox.create(timeout=120) for _ in range(6)]
        assert node.log().count("gave back pre-created sandbox") == 3
        for sbx in plain:
            assert sbx.commands.run("echo $HOME").stdout.strip() == "/home/user"
        for sbx in [source, child, *plain]:
            sbx.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert not leaked_sandboxes(node.home)


_RESTORED_INTO = re.compile(r"restored sandbox (\w+) \(pid \d+\) into pre-created sandbox (\w+)")


def _wait_gone(*paths: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(p.exists() for p in paths):
        assert time.monotonic() < deadline, [str(p) for p in paths if p.exists()]
        time.sleep(0.1)


def _paused_to_disk(node: NodeServer, sandbox_id: str, times: int = 1,
                    timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while node.log().count(f"paused {sandbox_id} to disk") < times:
        assert time.monotonic() < deadline, f"{sandbox_id} was not paused to disk"
        time.sleep(0.2)


def _check_resumed(sbx: Sandbox, nonce: str) -> None:
    assert sbx.files.read("/home/user/nonce") == nonce
    first = int(sbx.files.read("/tmp/count").strip())
    time.sleep(0.4)
    assert int(sbx.files.read("/tmp/count").strip()) > first  # the process runs on


def test_a_resume_from_disk_takes_a_precreated_sandbox_and_survives_a_crash() -> None:
    """With memory workspaces a paused sandbox's restore goes into a pre-created sandbox of
    its shape, which then *is* the sandbox (runsc's id stays the pre-created one's): it
    pauses and resumes again, is found again by a restarted node, and leaves nothing."""
    settings = {"workspace": "memory", "warm_pool_size": "0", "precreate_pool_size": "2",
                "pause_hot_s": "0"}
    with serving(**settings) as node:
        _wait_precreated(node, 2)
        sbx = Sandbox.create(timeout=300)
        sid = sbx.sandbox_id
        nonce = f"n-{time.time_ns()}"
        sbx.files.write("/home/user/nonce", nonce)
        sbx.commands.run(COUNT)
        time.sleep(0.3)
        _wait_precreated(node, 3)  # refilled after the create took one

        assert sbx.pause()
        _paused_to_disk(node, sid)
        again = Sandbox.connect(sid, timeout=300)
        into = dict(_RESTORED_INTO.findall(node.log()))
        assert sid in into and into[sid] != sid, "the resume did not use a pre-created sandbox"
        _check_resumed(again, nonce)
        # The swapped-out rootfs goes in the background, off the resume's path.
        _wait_gone(node.home / "sandboxes" / into[sid])
        assert not (node.home / "runtime" / into[sid]).exists()
        assert (node.home / "runtime" / sid / "bundle" / "container-id").read_text() == into[sid]

        # Paused and resumed again: the driver finds its files under the sandbox's id.
        _wait_precreated(node, 4)
        assert again.pause()
        _paused_to_disk(node, sid, times=2)
        again = Sandbox.connect(sid, timeout=300)
        _check_resumed(again, nonce)

        # A node killed and started again finds the sandbox by its id, not runsc's.
        node.kill9()
        slots = {k: node.env[f"AENV_{k.upper()}"] for k in ("net_first_index", "net_last_index")}
        restarted = start_server(node.port, home=node.home, **slots, **settings)
        node.process = restarted.process
        assert sid in {i.sandbox_id for i in Sandbox.list().next_items()}
        _check_resumed(Sandbox.connect(sid, timeout=300), nonce)
        Sandbox.kill(sid)
        # The kill answers once the sandbox is stopped; its files go right after.
        _wait_gone(node.home / "sandboxes" / sid, node.home / "runtime" / sid)
    assert not leaked_sandboxes(node.home)
