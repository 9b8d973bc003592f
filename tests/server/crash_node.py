"""A node server that tests kill -9 and start again on the same home, and what they check
after: the sandboxes and snapshots it lists, directory entries, the calls the crash cut short.
Shared by the crash tests (lifecycle, repository, builds, a full disk)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

from e2b import Sandbox, SandboxQuery, SandboxState

from tests.conftest import free_port
from tests.server.harness import (
    NodeServer,
    cleanup_home,
    client_env,
    kill_leaked,
    start_server,
)

MARK = "/home/user/mark"
LIVE = [SandboxState.RUNNING, SandboxState.PAUSED]
#: How long an in-flight request may take to notice the server is gone.
ORPHANED_CALL_S = 30.0


class CrashableNode:
    """One server home across crashes: ``kill9`` kills the server with SIGKILL, ``restart``
    starts a new one on the same home, port, slot range and settings."""

    def __init__(self, **settings: str) -> None:
        # A restore that never answers (a broken memory image) fails in 15 s, not 30.
        self.settings = {"envd_ready_timeout_s": "15", **settings}
        self.server: NodeServer = start_server(free_port(), **self.settings)
        self.home = self.server.home
        self.slots = {k: self.server.env[f"AENV_{k.upper()}"]
                      for k in ("net_first_index", "net_last_index")}
        self._log_offset = 0
        os.environ.update(client_env(self.server))
        os.environ.pop("E2B_DEBUG", None)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    @property
    def paused_dir(self) -> Path:
        return self.home / "paused"

    def kill9(self) -> None:
        self.server.kill9()

    def restart(self) -> None:
        assert self.server.process.poll() is not None, "kill the server first"
        self._log_offset = len(self.server.log())
        self.server = start_server(self.server.port, home=self.home,
                                   **{**self.settings, **self.slots})

    def log_since_restart(self) -> str:
        return self.server.log()[self._log_offset:]


@contextlib.contextmanager
def crashable(**settings: str) -> Iterator[CrashableNode]:
    saved = dict(os.environ)
    node = CrashableNode(**settings)
    failed = True
    leaked: list[int] = []
    try:
        yield node
        failed = False
    finally:
        if node.server.process.poll() is None:
            with contextlib.suppress(Exception):  # never hide the test's own failure
                kill_live()
        node.server.stop()
        leaked = kill_leaked(node.home)
        os.environ.clear()
        os.environ.update(saved)
        log = node.server.log()
        if failed or leaked or "Traceback" in log:
            print(f"server log ({node.home}):\n" + log[-12000:])
        cleanup_home(node.home)
    assert not leaked, f"runsc processes outlived the server: {leaked}"


def live_sandboxes() -> dict[str, SandboxState]:
    found: dict[str, SandboxState] = {}
    paginator = Sandbox.list(query=SandboxQuery(state=LIVE), limit=100)
    while paginator.has_next:
        for info in paginator.next_items():
            found[info.sandbox_id] = info.state
    return found


def snapshot_ids() -> list[str]:
    found: list[str] = []
    paginator = Sandbox.list_snapshots(limit=100)
    while paginator.has_next:
        found.extend(s.snapshot_id for s in paginator.next_items())
    return found


def kill_live() -> None:
    for sandbox_id in live_sandboxes():
        with contextlib.suppress(Exception):
            Sandbox.kill(sandbox_id)


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
          call: Future[Any] | None = None) -> None:
    """Wait for ``condition``; give up early (quietly) once ``call`` has finished."""
    deadline = time.monotonic() + timeout
    while not condition():
        if call is not None and call.done():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.005)


def entries_of(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def outcomes_of(futures: list[Future[Any]]) -> list[Any]:
    """The result of each call the crash cut short, or the exception it met."""
    _, pending = wait(futures, timeout=ORPHANED_CALL_S)
    assert not pending, "a request to the killed server did not end"
    out = []
    for future in futures:
        exc = future.exception()
        out.append(exc if exc is not None else future.result())
    return out
