"""The ``aenv`` console script run as a subprocess, the way a person or a script runs it: the
node's URL and key in its environment, a config directory of its own (no test reads or writes
the user's ``~/.config/aenv``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.server.harness import NodeServer, client_env

AENV = Path(sys.executable).with_name("aenv")


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
    config_dir: Path | None = None
    timeout_s: float = 120.0

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))}
        env.update(client_env(self.node), COLUMNS="200", NO_COLOR="1")
        if self.config_dir is not None:
            env["AENV_CONFIG_DIR"] = str(self.config_dir)
        env.update(extra)
        return env

    def __call__(self, *args: str, input: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Result:
        started = time.monotonic()
        done = subprocess.run([str(AENV), *args], env={**self.env(), **(env or {})}, cwd=cwd,
                              text=True, capture_output=True, timeout=self.timeout_s,
                              input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        return Result(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
