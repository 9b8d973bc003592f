"""Fixtures shared by the test packages that drive one real node per session through a
client (``tests/client``, ``tests/rl``, ``tests/cli``): import them into a ``conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

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
    """Ids of the node's sandboxes (running or paused) carrying ``labels`` (all of them when
    none are given), asked straight over HTTP, sorted."""
    query = "&".join(f"{k}={v}" for k, v in labels.items())
    response = httpx.get(f"{server.url}/v2/sandboxes",
                         params={"metadata": query} if query else None,
                         headers={"X-API-KEY": API_KEY}, timeout=30)
    response.raise_for_status()
    return sorted(s["sandboxID"] for s in response.json())
