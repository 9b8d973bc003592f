"""Shared test configuration, and how the suite runs on two xdist workers.

``make test`` runs the suite in two steps: everything but ``tests/network`` and
``tests/runtime`` on ``-n 2`` workers with ``--dist loadfile`` (one worker runs all of a test
module, so a module's node starts once), then those two directories on their own, one test
after another: they use fixed host resources (slot indices from 61,000, their own cgroup
parent). Each worker's node servers take a slot range of their own
(``tests/server/harness.py``). Before the workers start, the controller fills the caches the
tests share (``prepare_shared_caches``), so that no two workers build the base template at once.
"""

from __future__ import annotations

import os
import socket

import pytest


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
