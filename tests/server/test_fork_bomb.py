"""A fork bomb (issue 21, item 8; real server, real gVisor, the real e2b SDK).

A bash fork bomb, as root or as the default user, ends its sandbox within seconds on runsc
20240729: the runtime's host tasks grow with the guest's churn of processes until the
sandbox's host pids limit, and the sentry panics. Measured and not shipped on: a pids cgroup
inside the sandbox with envd killing what reaches it (``envd/pidlimit.py``,
``runtime/oci.Limits.guest_pids``, off) saved the sandbox about half the time. What holds:
the neighbour never notices, and the death says why — before, "the sandbox's runtime exited
with status 2".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

BOMB = "bomb() { bomb | bomb & }; bomb; sleep 60"
#: The bomb's command ends well before its own sleep would (measured: ~2-5 s).
ENDED_S = 45


@pytest.fixture
def pair(server: NodeServer) -> Iterator[tuple[Sandbox, Sandbox]]:
    a = Sandbox.create(timeout=180)
    b = Sandbox.create(timeout=180)
    try:
        yield a, b
    finally:
        for sbx in (a, b):
            try:
                sbx.kill()
            except Exception:  # already dead: the failure is reported by the test
                pass


class Neighbour:
    """Runs a command in ``sbx`` every 0.5 s while the bomb goes off; counts failures."""

    def __init__(self, sbx: Sandbox) -> None:
        self.sbx = sbx
        self.ok = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                assert self.sbx.commands.run("echo alive", timeout=20).stdout == "alive\n"
                self.ok += 1
            except Exception as exc:
                self.errors.append(repr(exc)[:200])
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _death(server: NodeServer, sandbox_id: str, timeout: float = 30) -> tuple[int, str]:
    """Wait for the sandbox's info to answer 404 (it died); status and message."""
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.get(f"{server.url}/sandboxes/{sandbox_id}",
                             headers={"X-API-Key": API_KEY}, timeout=10)
        if response.status_code == 404 or time.monotonic() > deadline:
            return response.status_code, str(response.json().get("message"))
        time.sleep(0.5)


@pytest.mark.parametrize("user", ["root", "user"])
def test_a_fork_bomb_that_ends_its_sandbox_says_so(
    server: NodeServer, pair: tuple[Sandbox, Sandbox], user: str,
) -> None:
    a, b = pair
    neighbour = Neighbour(b)
    try:
        with pytest.raises(Exception):  # noqa: B017 — the stream ends however the SDK says
            a.commands.run(BOMB, user=user, timeout=ENDED_S)
        status, message = _death(server, a.sandbox_id)
    finally:
        neighbour.stop()
    print(f"bomb as {user}: {status} {message}; neighbour answered {neighbour.ok} times")
    assert status == 404
    assert "pids limit" in message and "status 2" not in message
    assert neighbour.ok > 0 and not neighbour.errors, neighbour.errors
    assert b.commands.run("echo alive", timeout=20).stdout == "alive\n"


# Not tested, because it does not hold on the ptrace platform: a fork bomb that ends its command
# and not its sandbox (docs/lifecycle.md, *When a sandbox dies*: what was measured, and what
# would hold it).
