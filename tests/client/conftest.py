"""One real node server (gVisor sandboxes) for the ``aenv.client`` tests, and a client factory
that checks nothing of a test's run is left on the node afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from aenv.client import AsyncClient
from tests.server.harness import API_KEY, NodeServer, serving


@pytest.fixture(scope="session")
def node() -> Iterator[NodeServer]:
    with serving() as server:
        yield server


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads (or writes) the user's own ``~/.config/aenv``."""
    path = tmp_path / "aenv-config"
    monkeypatch.setenv("AENV_CONFIG_DIR", str(path))
    return path


def labelled(server: NodeServer, **labels: str) -> list[str]:
    """Ids of the node's sandboxes carrying ``labels``, asked straight over HTTP."""
    query = "&".join(f"{k}={v}" for k, v in labels.items())
    response = httpx.get(f"{server.url}/v2/sandboxes", params={"metadata": query},
                         headers={"X-API-KEY": API_KEY}, timeout=30)
    response.raise_for_status()
    return sorted(s["sandboxID"] for s in response.json())


@pytest.fixture
async def client(node: NodeServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.url, API_KEY) as c:
        yield c
    assert labelled(node, run=c.run_id) == [], "the client's exit left sandboxes of its run"
