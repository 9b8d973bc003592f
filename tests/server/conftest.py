"""One real node server (gVisor sandboxes) per test session, driven by the official SDKs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.conftest import free_port
from tests.server.harness import (
    NodeServer,
    cleanup_home,
    client_env,
    kill_leaked,
    start_server,
)


@pytest.fixture(scope="session")
def server() -> Iterator[NodeServer]:
    node = start_server(free_port())
    saved = {k: os.environ.get(k) for k in client_env(node)}
    os.environ.update(client_env(node))
    os.environ.pop("E2B_DEBUG", None)
    try:
        yield node
    finally:
        try:
            _kill_all()
        finally:
            node.stop()
            leaked = kill_leaked(node.home)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if "Traceback" in node.log():
                print("server log contains tracebacks:\n" + node.log()[-8000:])
            cleanup_home(node.home)
            assert not leaked, f"runsc processes outlived the server: {leaked}"


def _kill_all() -> None:
    paginator = Sandbox.list()
    while paginator.has_next:
        for info in paginator.next_items():
            Sandbox.kill(info.sandbox_id)


@pytest.fixture
def sandbox(server: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()
