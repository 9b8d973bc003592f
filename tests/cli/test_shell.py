"""``aenv start`` and ``aenv connect`` driven in tmux: a real terminal, keys, the screen, a resize.

One session: start a shell in a new sandbox, type a command and read its output on the screen,
resize the window and see ``stty size`` follow, detach with Ctrl-] (the sandbox and the shell
run on), ``aenv connect`` to the same shell (its variables and directory still there), exit it
(the sandbox stays: connect does not kill), and finally ``start`` + ``exit`` kills its sandbox.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.cli.conftest import AENV, Cli

SCREEN_TIMEOUT_S = 60.0


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True,
                              timeout=30).stdout

    def start(self, env: dict[str, str], command: str) -> None:
        exports = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
        # The pane stays after aenv exits, so its last words can be read.
        self.tmux("new-session", "-d", "-s", self.name, "-x", "120", "-y", "40", *exports,
                  f"{command}; echo EXITED=$?; sleep 600")

    def window(self, env: dict[str, str], command: str) -> None:
        exports = [arg for k, v in env.items() for arg in ("-e", f"{k}={v}")]
        self.tmux("new-window", "-t", self.name, *exports, f"{command}; echo EXITED=$?; sleep 600")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.name, *keys)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, check: Callable[[str], object], what: str) -> object:
        deadline = time.monotonic() + SCREEN_TIMEOUT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            found = check(screen)
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"not on the screen after {SCREEN_TIMEOUT_S}s: {what}\n"
                             f"{self.screen()}")

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True,
                       check=False)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    session = Tmux(f"aenv-cli-{uuid.uuid4().hex[:8]}")
    try:
        yield session
    finally:
        session.kill()


def states(aenv: Cli) -> dict[str, str]:
    return {s["sandboxID"]: s["state"] for s in json.loads(aenv("ls", "--json").stdout)}


def test_start_resize_detach_connect(aenv: Cli, tmux: Tmux) -> None:
    before = set(states(aenv))
    tmux.start(aenv.env(), f"{shlex.quote(str(AENV))} start base -m cli=shell")
    sid = str(tmux.wait_for(lambda s: (m := re.search(r"sandbox (\w{20}): Ctrl-\] detaches", s))
                            and m.group(1), "the session's banner"))
    assert sid not in before
    tmux.wait_for(lambda s: "user@" in s, "a prompt")

    tmux.keys("echo hello-$((6*7))", "Enter")
    tmux.wait_for(lambda s: "\nhello-42" in s, "the command's output")

    tmux.keys("stty size", "Enter")
    tmux.wait_for(lambda s: "\n40 120" in s, "the first size")
    tmux.tmux("resize-window", "-t", tmux.name, "-x", "100", "-y", "30")
    tmux.keys("clear; stty size", "Enter")
    tmux.wait_for(lambda s: "\n30 100" in s or s.startswith("30 100"), "the new size")

    tmux.keys("cd /tmp; MARK=still-here", "Enter")
    tmux.keys("C-]")
    tmux.wait_for(lambda s: f"detached from {sid}" in s and "EXITED=0" in s, "the detach")
    assert states(aenv)[sid] == "running"

    tmux.window(aenv.env(), f"{shlex.quote(str(AENV))} connect {sid}")
    tmux.wait_for(lambda s: "attached to shell" in s, "the reattach")
    tmux.keys('echo "$MARK in $PWD"', "Enter")
    tmux.wait_for(lambda s: "\nstill-here in /tmp" in s, "the same shell's state")
    tmux.keys("exit 7", "Enter")
    tmux.wait_for(lambda s: "EXITED=7" in s, "the shell's exit code")
    assert states(aenv)[sid] == "running"  # connect leaves the sandbox as it was

    # start's own shell exiting (no --keep) kills its sandbox.
    tmux.window(aenv.env(), f"{shlex.quote(str(AENV))} connect --new {sid}")
    tmux.wait_for(lambda s: "user@" in s, "a prompt of a new shell")
    tmux.keys("exit", "Enter")
    tmux.wait_for(lambda s: "EXITED=0" in s, "the new shell's end")
    assert aenv("kill", sid).code == 0

    tmux.window(aenv.env(), f"{shlex.quote(str(AENV))} start base")
    second = str(tmux.wait_for(
        lambda s: (m := re.search(r"sandbox (\w{20}): Ctrl-\] detaches", s)) and m.group(1),
        "the second session's banner"))
    tmux.wait_for(lambda s: "user@" in s, "a prompt")
    tmux.keys("exit", "Enter")
    tmux.wait_for(lambda s: "EXITED=0" in s, "the second shell's end")
    assert second not in states(aenv)


def test_needs_a_terminal(aenv: Cli) -> None:
    done = aenv("start", "base")
    assert done.code == 1 and len(done.errors()) == 1, done
    assert "terminal" in done.errors()[0]
