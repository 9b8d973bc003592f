"""Paused sandboxes kept ready to resume (``orchestrator/resume_ready.py``), through the SDK.

With disk workspaces a sandbox written to disk gets a runtime sandbox created ahead on its own
disk, in a network slot of its own; its resume restores into that one. It must resume with
its files and running process as a fresh restore would; the node keeps at most
``resume_ready_size`` (the newest), gives one up for a sandbox that finds no free slot, and
after a crash or a kill nothing of a ready sandbox is left running.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState

from tests.counter import COUNT
from tests.server.harness import (
    NodeServer,
    leaked_sandboxes,
    runsc_of,
    serving,
    start_server,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(600)]

SETTINGS = {"workspace": "disk", "pause_hot_s": "0", "warm_pool_size": "0",
            "resume_ready_size": "2"}
_RESUMED = re.compile(r"resumed (\w+) \(restored\) in \d+ ms: repository \d+, (\w+)")


def _runsc_of(node: NodeServer, sandbox_id: str) -> list[int]:
    return runsc_of(node.home, sandbox_id)


def _wait_log(node: NodeServer, text: str, times: int = 1, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while node.log().count(text) < times:
        assert time.monotonic() < deadline, f"the node never logged {text!r} ({times}x)"
        time.sleep(0.1)


def _ready(node: NodeServer, sandbox_id: str, times: int = 1) -> None:
    _wait_log(node, f"paused sandbox {sandbox_id} is ready to resume", times)


def _resumed_via(node: NodeServer, sandbox_id: str) -> list[str]:
    """How each restore of ``sandbox_id`` began: ``ready``, else ``slot``."""
    return [first for sid, first in _RESUMED.findall(node.log()) if sid == sandbox_id]


def _start(nonce: str) -> Sandbox:
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("/home/user/nonce", nonce)
    sbx.commands.run(COUNT)
    time.sleep(0.3)
    return sbx


def _check_resumed(sbx: Sandbox, nonce: str) -> None:
    assert sbx.files.read("/home/user/nonce") == nonce
    first = int(sbx.files.read("/tmp/count").strip())
    deadline = time.monotonic() + 10
    while int(sbx.files.read("/tmp/count").strip()) <= first:
        assert time.monotonic() < deadline, f"{sbx.sandbox_id}: the counter stopped"
        time.sleep(0.2)


def _wait_no_runsc(node: NodeServer, sandbox_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _runsc_of(node, sandbox_id):
        assert time.monotonic() < deadline, f"runsc processes of {sandbox_id} are left"
        time.sleep(0.2)


def _wait_slots_held(node: NodeServer, count: int, timeout: float = 30.0) -> None:
    """Until ``count`` of the node's network slots exist (``net_pool_size`` 0: no slot is
    made ahead, so each is a sandbox's)."""
    first, last = (int(node.env[f"AENV_NET_{k}_INDEX"]) for k in ("FIRST", "LAST"))
    deadline = time.monotonic() + timeout
    while sum(Path(f"/run/netns/aenv-{i}").exists() for i in range(first, last + 1)) > count:
        assert time.monotonic() < deadline, f"more than {count} network slots are held"
        time.sleep(0.1)


def test_a_paused_sandbox_resumes_into_the_sandbox_made_ready_for_it_and_survives_a_crash(
) -> None:
    with serving(**SETTINGS) as node:
        sbx = _start(nonce := f"n-{time.time_ns()}")
        sid = sbx.sandbox_id
        assert sbx.pause()
        _ready(node, sid)
        assert _runsc_of(node, sid), "nothing was created for the paused sandbox"
        assert (node.home / "paused" / sid).is_dir()
        assert Sandbox.get_info(sid).state == SandboxState.PAUSED

        again = Sandbox.connect(sid, timeout=300)
        assert _resumed_via(node, sid) == ["ready"]
        _check_resumed(again, nonce)
        assert not (node.home / "paused" / sid).exists()  # the image was consumed

        # A connect right as the sandbox reaches the disk races its ready sandbox being
        # made: the resume waits for its turn, then restores into whatever the record names.
        for round_ in (2, 3):
            assert again.pause()
            _wait_log(node, f"paused {sid} to disk", round_)
            again = Sandbox.connect(sid, timeout=300)
            _check_resumed(again, nonce)
        assert len(_resumed_via(node, sid)) == 3
        again.files.write("/home/user/after", "written after the resumes")

        # Paused again and made ready again; then the node crashes: the restarted node
        # runs nothing of the paused sandbox, and resumes it afresh from its image.
        made = node.log().count(f"paused sandbox {sid} is ready to resume")
        assert again.pause()
        _ready(node, sid, times=made + 1)
        node.kill9()
        slots = {k: node.env[f"AENV_{k.upper()}"] for k in ("net_first_index", "net_last_index")}
        restarted = start_server(node.port, home=node.home, **slots, **SETTINGS)
        node.process = restarted.process
        _wait_no_runsc(node, sid)
        assert Sandbox.get_info(sid).state == SandboxState.PAUSED
        again = Sandbox.connect(sid, timeout=300)
        assert _resumed_via(node, sid)[-1] == "slot"
        _check_resumed(again, nonce)
        assert again.files.read("/home/user/after") == "written after the resumes"

        # A kill of a ready paused sandbox leaves nothing of it running.
        assert again.pause()
        _ready(node, sid, times=made + 2)
        Sandbox.kill(sid)
        _wait_no_runsc(node, sid)
    assert not leaked_sandboxes(node.home)


def test_the_newest_are_kept_ready_and_one_gives_its_slot_to_a_sandbox_that_needs_it(
) -> None:
    # Three slots: two ready paused sandboxes and one running sandbox fill them.
    with serving(**SETTINGS, slot_count="3", net_pool_size="0") as node:
        first, second, third = (_start(f"n-{i}-{time.time_ns()}") for i in range(3))
        nonces = {s.sandbox_id: s.files.read("/home/user/nonce") for s in (first, second, third)}
        for sbx in (first, second, third):
            assert sbx.pause()
            _ready(node, sbx.sandbox_id)
        # Two at most: the oldest was given up when the third was made ready.
        _wait_log(node, f"paused sandbox {first.sandbox_id} is no longer kept ready")
        _wait_no_runsc(node, first.sandbox_id)
        assert _runsc_of(node, second.sandbox_id) and _runsc_of(node, third.sandbox_id)

        # The first resumes afresh into the free slot: now every slot is held.
        resumed = Sandbox.connect(first.sandbox_id, timeout=300)
        assert _resumed_via(node, first.sandbox_id) == ["slot"]
        _check_resumed(resumed, nonces[first.sandbox_id])
        # A create finds no free slot and takes the oldest ready sandbox's.
        extra = Sandbox.create(timeout=120)
        assert extra.commands.run("echo up").stdout.strip() == "up"
        _wait_log(node, f"gave up the ready-to-resume sandbox of {second.sandbox_id}")
        _wait_no_runsc(node, second.sandbox_id)
        extra.kill()
        # The kill answers before its slot is released (a resume finding none would take
        # the last ready sandbox's): wait for it, so each resume below goes its own way.
        _wait_slots_held(node, 2)
        # The one given up resumes afresh, the one still ready into its own.
        for sbx, via in ((second, "slot"), (third, "ready")):
            again = Sandbox.connect(sbx.sandbox_id, timeout=300)
            assert _resumed_via(node, sbx.sandbox_id) == [via]
            _check_resumed(again, nonces[sbx.sandbox_id])
    assert not leaked_sandboxes(node.home)
