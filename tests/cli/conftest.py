"""One real node (gVisor sandboxes) for the CLI tests, and ``aenv`` run as a subprocess.

Every test drives the installed console script (``.venv/bin/aenv``) the way a person or a script
would, with the node's URL and key in its environment and a config directory of its own (no
test reads or writes the user's ``~/.config/aenv``). Sandboxes made for a test are created with
the e2b SDK and killed after it; the session's ``serving()`` kills whatever is left and checks
that no runsc process outlived the node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.server.harness import NodeServer, client_env, serving

AENV = Path(sys.executable).with_name("aenv")
CLI_TIMEOUT_S = 120


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@dataclass(frozen=True)
class Cli:
    node: NodeServer
    config_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
        env.update(client_env(self.node), COLUMNS="200", NO_COLOR="1",
                   AENV_CONFIG_DIR=str(self.config_dir))
        env.update(extra)
        return env

    def __call__(self, *args: str, input: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Result:
        started = time.monotonic()
        done = subprocess.run([str(AENV), *args], env={**self.env(), **(env or {})}, cwd=cwd,
                              text=True, capture_output=True, timeout=CLI_TIMEOUT_S,
                              input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        return Result(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


@pytest.fixture(scope="session")
def node() -> Iterator[NodeServer]:
    with serving() as server:
        yield server


@pytest.fixture
def aenv(node: NodeServer, tmp_path: Path) -> Cli:
    return Cli(node, tmp_path / "aenv-config")


@pytest.fixture
def sandbox(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=300)
    try:
        yield sbx
    finally:
        sbx.kill()
