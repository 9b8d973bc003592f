"""One real node server (gVisor sandboxes) per test session, driven by the official SDKs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.server.harness import NodeServer, serving


@pytest.fixture(scope="session")
def server() -> Iterator[NodeServer]:
    with serving() as node:
        yield node


@pytest.fixture
def sandbox(server: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()
