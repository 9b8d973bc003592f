"""Shared test configuration."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
