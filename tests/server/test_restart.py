"""Sandboxes survive a crash of the server and are re-attached when it starts again."""

from __future__ import annotations

import os

import pytest
from e2b import Sandbox

from tests.conftest import free_port
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
