"""Idle auto-pause (``orchestrator/idle.py``): a sandbox without API or proxy traffic for its
idle limit (``aenv.idlePauseSeconds`` metadata, else the node's ``idle_pause_s``) is paused,
and resumes on its next proxied request (``autoResume``) or on ``connect``; an open command
stream is traffic for as long as it lasts.

The state is watched with ``Sandbox.list``: ``get_info`` names the sandbox, so it is traffic
and would keep it running.
"""

from __future__ import annotations

import threading
import time

import pytest
from e2b import Sandbox, SandboxState
from e2b.sandbox.commands.command_handle import CommandResult

from tests.server.harness import serving
from tests.server.test_lifecycle import wait_for

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

KEY = "aenv.idlePauseSeconds"


def listed_state(sandbox_id: str) -> SandboxState | None:
    paginator = Sandbox.list()
    while paginator.has_next:
        for info in paginator.next_items():
            if info.sandbox_id == sandbox_id:
                return info.state
    return None


def paused(sandbox_id: str) -> bool:
    return listed_state(sandbox_id) == SandboxState.PAUSED


def test_idle_sandboxes_pause_and_resume_on_traffic() -> None:
    with serving() as node:
        with pytest.raises(Exception, match=KEY):
            Sandbox.create(timeout=60, metadata={KEY: "soon"})
        idle = Sandbox.create(timeout=120, metadata={KEY: "2"},
                              lifecycle={"on_timeout": "pause", "auto_resume": True})
        plain = Sandbox.create(timeout=120)
        busy = Sandbox.create(timeout=120, metadata={KEY: "2"})
        idle.files.write("/home/user/before.txt", "written before the idle pause")
        quiet_since = time.monotonic()

        ran: list[CommandResult] = []
        command = threading.Thread(
            target=lambda: ran.append(busy.commands.run("sleep 5; echo done", timeout=30)))
        command.start()
        wait_for("the idle pause", lambda: paused(idle.sandbox_id), timeout=10, every=0.2)
        assert time.monotonic() - quiet_since >= 2
        # The long command's stream is traffic for as long as it is open.
        while command.is_alive():
            assert listed_state(busy.sandbox_id) == SandboxState.RUNNING
            time.sleep(0.3)
        command.join()
        assert ran and ran[0].stdout == "done\n"
        stream_ended = time.monotonic()
        assert listed_state(busy.sandbox_id) == SandboxState.RUNNING

        assert Sandbox.get_info(idle.sandbox_id).state == SandboxState.PAUSED
        # Through the proxy: autoResume resumes it, the command runs, the files are there.
        assert idle.commands.run("echo hi").stdout == "hi\n"
        assert idle.files.read("/home/user/before.txt") == "written before the idle pause"
        assert listed_state(idle.sandbox_id) == SandboxState.RUNNING

        # Idle from the end of its stream: paused, and (no autoResume) back with connect.
        wait_for("the idle pause after the stream", lambda: paused(busy.sandbox_id),
                 timeout=10, every=0.2)
        assert time.monotonic() - stream_ended >= 1.5
        assert Sandbox.connect(busy.sandbox_id).commands.run("echo back").stdout == "back\n"

        # No key, node default off: never paused (it has been idle for over 8 s by now).
        assert listed_state(plain.sandbox_id) == SandboxState.RUNNING
        assert "idle-paused " + idle.sandbox_id in node.log()


def test_node_default_and_per_sandbox_opt_out() -> None:
    with serving(idle_pause_s="2") as node:
        kept = Sandbox.create(timeout=120, metadata={KEY: "0"})
        default = Sandbox.create(timeout=120)
        wait_for("the idle pause by the node default", lambda: paused(default.sandbox_id),
                 timeout=10, every=0.2)
        time.sleep(1.5)
        assert listed_state(kept.sandbox_id) == SandboxState.RUNNING
        assert kept.commands.run("echo still").stdout == "still\n"
        assert "idle-paused " + default.sandbox_id in node.log()
