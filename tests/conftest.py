"""Shared test configuration."""

from __future__ import annotations

import importlib.util
import socket

import pytest

# The node-server suite needs the composition root; until it exists the suite is not collected.
collect_ignore_glob = [] if importlib.util.find_spec("aenv.server") else ["server/*"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
