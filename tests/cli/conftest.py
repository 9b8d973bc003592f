"""One real node (gVisor sandboxes) for the CLI tests, and ``aenv`` run as a subprocess.

Every test drives the installed console script (``.venv/bin/aenv``) the way a person or a script
would, with the node's URL and key in its environment and a config directory of its own (no
test reads or writes the user's ``~/.config/aenv``). Sandboxes made for a test are created with
the e2b SDK and killed after it; the session's ``serving()`` kills whatever is left and checks
that no runsc process outlived the node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.cli_run import AENV, Cli, Result
from tests.node_fixtures import node
from tests.server.harness import NodeServer

__all__ = ["AENV", "Cli", "Result", "node"]  # for the tests

CLI_TIMEOUT_S = 120


@pytest.fixture
def aenv(node: NodeServer, tmp_path: Path) -> Cli:
    return Cli(node, tmp_path / "aenv-config", timeout_s=CLI_TIMEOUT_S)


@pytest.fixture
def sandbox(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=300)
    try:
        yield sbx
    finally:
        sbx.kill()
