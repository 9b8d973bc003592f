"""One real node server (gVisor sandboxes) for the ``aenv.client`` tests, and a client factory
that checks nothing of a test's run is left on the node afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from aenv.client import AsyncClient
from tests.node_fixtures import config_dir, labelled, node
from tests.server.harness import API_KEY, NodeServer

__all__ = ["config_dir", "labelled", "node"]  # fixtures and a helper, for the tests


@pytest.fixture
async def client(node: NodeServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.url, API_KEY) as c:
        yield c
    assert labelled(node, run=c.run_id) == [], "the client's exit left sandboxes of its run"
