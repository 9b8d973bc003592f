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


@pytest.fixture(autouse=True)
def sdk_env_of_the_node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that uses a node fixture (``server``, ``node``): the SDK pointed at it for
    the test, whatever an earlier test or fixture of this process left in the environment
    (the suite's files run in any order, on several processes: ``tests/shards.py``)."""
    from tests.server.harness import NodeServer, client_env, newest

    used = [request.getfixturevalue(n) for n in ("server", "node") if n in request.fixturenames]
    node = newest([n for n in used if isinstance(n, NodeServer)])
    if node is not None:
        for key, value in client_env(node).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("E2B_DEBUG", raising=False)


#: Seconds per test file (setup, call and teardown of its tests), for ``tests/shards.py``.
_file_seconds: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _file_seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("AENV_TEST_DURATIONS_OUT")
    if out:
        rounded = {path: round(s, 1) for path, s in sorted(_file_seconds.items())}
        Path(out).write_text(json.dumps(rounded, indent=1) + "\n")
