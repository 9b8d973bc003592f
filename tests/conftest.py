"""Shared test configuration."""

from __future__ import annotations

import json
import os
import socket
from collections import defaultdict
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


#: Seconds per test file (setup, call and teardown of its tests), for ``tests/shards.py``.
_file_seconds: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _file_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("AENV_TEST_DURATIONS_OUT")
    if out:
        rounded = {path: round(s, 1) for path, s in sorted(_file_seconds.items())}
        Path(out).write_text(json.dumps(rounded, indent=1) + "\n")
