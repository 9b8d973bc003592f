"""The escape suite: one real node (gVisor sandboxes, the e2b SDK), a LAN and an "internet"
stood up in network namespaces before the node starts (so its first read of the node's
networks already holds the LAN)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.network.fixtures import internet, lan
from tests.network.peers import InternetPeer, LanPeer
from tests.server.harness import NodeServer, serving

__all__ = ["internet", "lan"]


@pytest.fixture(scope="session")
def server(lan: LanPeer, internet: InternetPeer) -> Iterator[NodeServer]:
    with serving() as node:
        yield node


@pytest.fixture
def sandbox(server: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()
