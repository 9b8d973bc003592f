"""Shared test configuration."""

from __future__ import annotations

import json
import os
import socket
from collections import defaultdict
from pathlib import Path

import pytest


def slot_base() -> int:
    """The first network slot of this test session's block of 10,000
    (``tests/server/harness.py``); parallel sessions (the shards) are given their own."""
    return int(os.environ.get("AENV_TEST_SLOT_BASE", 20_000 + (os.getpid() % 4) * 10_000))


#: Ports handed out per test session, from a block of its own (below the kernel's ephemeral
#: range, which starts at 32768).
_PORTS_PER_SESSION = 500
_next_port = 0


def free_port() -> int:
    """A port free now, from this session's own block. A port the kernel picks (bind to 0)
    was handed to two shards at once: a node binds its port only once started (seconds), and
    meanwhile a fake-runtime node of another shard took the same port, so a test's SDK
    talked to the other shard's node (a file write answered by a fake guest)."""
    global _next_port
    # One block per thousand of the slot base (45 of them fit below 32,768): a session, the
    # benchmark it starts with its base + 5,000 and the other shards never share a port.
    first = 10_000 + (slot_base() // 1_000 % 45) * _PORTS_PER_SESSION
    for _ in range(_PORTS_PER_SESSION):
        port = first + _next_port % _PORTS_PER_SESSION
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {first}..{first + _PORTS_PER_SESSION - 1}")


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
