"""Sandboxes survive a crash of the server and are re-attached when it starts again."""

from __future__ import annotations

import os
import threading
import time

import pytest
from e2b import Sandbox

from tests.conftest import free_port
from tests.server.crash_node import crashable
from tests.server.harness import cleanup_home, client_env, kill_leaked, start_server

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


def test_kill9_with_five_running_sandboxes() -> None:
    server = start_server(free_port())
    saved = dict(os.environ)
    os.environ.update(client_env(server))
    os.environ.pop("E2B_DEBUG", None)
    try:
        sandboxes = [Sandbox.create(timeout=300, metadata={"restart": "1"}) for _ in range(5)]
        for i, sbx in enumerate(sandboxes):
            sbx.files.write("/home/user/mark", str(i))
        server.kill9()
        slots = {k: server.env[f"AENV_{k.upper()}"] for k in ("net_first_index", "net_last_index")}
        server = start_server(server.port, home=server.home, **slots)
        listed = {i.sandbox_id for i in Sandbox.list().next_items()}
        assert {s.sandbox_id for s in sandboxes} <= listed
        for i, sbx in enumerate(sandboxes):
            again = Sandbox.connect(sbx.sandbox_id)
            assert again.files.read("/home/user/mark") == str(i)
            assert again.commands.run("echo ok").stdout == "ok\n"
    finally:
        for info in Sandbox.list().next_items():
            Sandbox.kill(info.sandbox_id)
        server.stop()
        leaked = kill_leaked(server.home)
        os.environ.clear()
        os.environ.update(saved)
        cleanup_home(server.home)
    assert not leaked, f"runsc processes outlived the server: {leaked}"


def test_sigterm_cuts_a_command_stream_after_its_grace_and_the_sandbox_lives_on() -> None:
    """A command's output stream is a request under way for as long as the command runs: the
    node waits ``shutdown_grace_s`` for it, then closes it and stops."""
    ended: list[BaseException | None] = []

    def stream(sbx: Sandbox) -> None:
        try:
            sbx.commands.run("sleep 600", timeout=0)
            ended.append(None)
        except Exception as exc:  # the node went away under it: what the test wants
            ended.append(exc)

    with crashable(shutdown_grace_s="2") as node:
        sbx = Sandbox.create(timeout=300)
        sbx.files.write("/home/user/mark", "kept")
        streaming = threading.Thread(target=stream, args=(sbx,), daemon=True)
        streaming.start()
        deadline = time.monotonic() + 30
        while not any("sleep 600" in p.args for p in sbx.commands.list()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        started = time.monotonic()
        assert node.server.stop(), "the node waited out its 30 s for the stream"
        assert time.monotonic() - started < 15
        streaming.join(10)
        assert ended and ended[0] is not None, ended
        node.restart()
        assert Sandbox.connect(sbx.sandbox_id).files.read("/home/user/mark") == "kept"
