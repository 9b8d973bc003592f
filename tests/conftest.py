"""Shared test configuration, and how the suite runs on several xdist workers.

``make test`` runs the suite on ``-n 2`` workers with ``--dist loadgroup``: every test module is
a group of its own (one worker runs all of a module, so its module-scoped node starts once),
and the tests that use fixed host resources — ``tests/network`` (slot indices from 61,000) and
``tests/runtime`` (its own slot range and cgroup parent) — form one group, run by one worker
one after another. Each worker's node servers take a slot range of their own
(``tests/server/harness.py``). Before the workers start, the controller fills the caches the
tests share (``prepare_shared_caches``), so that no two workers build the base template at once.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: Test directories whose tests share fixed host resources: one worker runs them in turn.
SERIAL_GROUP = "host-network"
_SERIAL_DIRS = (TESTS / "network", TESTS / "runtime")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_configure(config: pytest.Config) -> None:
    workers = config.getoption("numprocesses", None) if config.pluginmanager.hasplugin(
        "xdist") else None
    if workers and not hasattr(config, "workerinput") and os.geteuid() == 0 \
            and not os.environ.get("AENV_TEST_NO_PREPARE"):
        from tests.server.harness import prepare_shared_caches

        prepare_shared_caches()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        serial = any(path.is_relative_to(d) for d in _SERIAL_DIRS)
        group = SERIAL_GROUP if serial else str(path.relative_to(TESTS))
        item.add_marker(pytest.mark.xdist_group(group))
