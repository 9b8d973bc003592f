"""A sandbox that dies is noticed at once (real server, real gVisor, the real e2b SDK).

(a) A sandbox with a small memory limit writes files into its in-memory root layer while its
command streams output, until the host's memory cgroup kills its runtime; (b) the runtime of
a sandbox whose command streams is killed with SIGKILL from outside. Either way: the SDK's
stream raises within ``STREAM_END_S`` of the death (target 1 s), ``is_running()`` is False,
``connect``/``get_info`` give E2B's not-found, the reason is in the node's log and in the
API's 404, and no process, mount, cgroup, runtime directory or network namespace of it is
left.

Each case measures the death itself with a pidfd on the sentry (the moment the kernel
reports the exit), not the last output line, and prints what it measured.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import NotFoundException, Sandbox

from aenv.orchestrator.deaths import SYNC_S
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

#: The issue's bar: the stream ends with an error within a second; asserted with slack for
#: a loaded 2-core machine.
STREAM_END_S = 5.0
#: Small, so the OOM comes after ~200 MiB of writes (a second or two) instead of ~1 GiB.
MEMORY_MB = 256
#: Long enough for the node's death watch to have started watching a new runtime: a runtime
#: that dies before is noticed too, but once reaped its exit status is lost ("status
#: unknown"), and the SIGKILL cases check that the signal is named.
WATCHED_S = 2 * SYNC_S
#: Writes 16 MiB files into the root's in-memory layer, one output line each, forever.
#: Files in /tmp (in the sandbox's memory; with disk workspaces a tmpfs of half of it), then
#: anonymous memory, 16 MiB a line. Anonymous memory alone does not do: past the sandbox's
#: memory size the guest's allocation fails (MemoryError) and the sandbox lives on.
FILL_MEMORY = (
    "i=0; while head -c 16777216 /dev/urandom > /tmp/fill$i; do i=$((i+1)); "
    "echo wrote $((i*16)) MiB; done; "
    "python3 -u -c 'held = []\nwhile True:\n    held.append(b\"x\" * (16 << 20))"
    "\n    print(\"held\", 16 * len(held), \"MiB\")'"
)
#: Streams one line every 0.1 s for a minute.
TICK = "for i in $(seq 600); do echo tick $i; sleep 0.1; done"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(default_memory_mb=str(MEMORY_MB), warm_pool_size="1") as server:
        yield server


class DeathClock:
    """When the sandbox's sentry exits, as the kernel reports it (a pidfd, in a thread)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.died_at: float | None = None
        self._fd = os.pidfd_open(pid)
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.poll()
        self.died_at = time.monotonic()
        os.close(self._fd)

    def join(self, timeout: float) -> float:
        self._thread.join(timeout)
        assert self.died_at is not None, f"sentry {self.pid} did not exit in {timeout} s"
        return self.died_at


def _sentry_pid(node: NodeServer, sandbox_id: str) -> int:
    return int((node.home / "runtime" / sandbox_id / "bundle" / "sandbox.pid").read_text())


def _netns(node: NodeServer, sandbox_id: str) -> tuple[Path, int]:
    config = json.loads((node.home / "runtime" / sandbox_id / "bundle" / "config.json").read_text())
    path = next(Path(n["path"]) for n in config["linux"]["namespaces"] if n["type"] == "network")
    return path, path.stat().st_ino


def _api_get(node: NodeServer, path: str) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    conn.request("GET", path, headers={"X-API-Key": API_KEY})
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


def _leftovers(node: NodeServer, sandbox_id: str, netns: tuple[Path, int]) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if sandbox_id.encode() in (entry / "cmdline").read_bytes():
                    found.append(f"process {entry.name}")
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if sandbox_id in line
    ]
    for cgroup in Path("/sys/fs/cgroup").glob(f"*/aenv/{sandbox_id}"):
        found.append(f"cgroup {cgroup}")
    if (node.home / "runtime" / sandbox_id).exists():
        found.append("runtime directory")
    path, inode = netns
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_ino == inode:  # a new slot may reuse the index, never the netns
            found.append(f"netns {path}")
    return found


def _gone(node: NodeServer, sandbox_id: str, netns: tuple[Path, int]) -> list[str]:
    """Leftovers once teardown had its time (it runs after the stream was ended)."""
    deadline = time.monotonic() + 30
    while (left := _leftovers(node, sandbox_id, netns)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _run_until_death(
    sbx: Sandbox, command: str, clock: DeathClock, on_started: threading.Event | None = None
) -> tuple[Exception, float, int]:
    """Run ``command`` streaming; the exception it ends with, the seconds from the sentry's
    death to that exception, and the number of output lines seen."""
    lines: list[str] = []

    def on_stdout(text: str) -> None:
        lines.append(text)
        if on_started is not None:
            on_started.set()

    with pytest.raises(Exception) as raised:
        sbx.commands.run(command, on_stdout=on_stdout, timeout=120)
    ended_at = time.monotonic()
    died_at = clock.join(10)
    return raised.value, ended_at - died_at, len(lines)


def _assert_dead(node: NodeServer, sbx: Sandbox, reason: str) -> None:
    sid = sbx.sandbox_id
    assert sbx.is_running() is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sid)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sid)
    assert sid not in {s.sandbox_id for s in Sandbox.list().next_items()}
    status, body = _api_get(node, f"/sandboxes/{sid}")
    assert status == 404
    assert reason in str(body.get("message")), body
    warnings = [
        line
        for line in node.log().splitlines()
        if "WARNING" in line and f"sandbox {sid} died" in line
    ]
    assert len(warnings) == 1 and reason in warnings[0], warnings


def test_a_sandbox_out_of_memory_ends_its_stream_at_once_and_is_gone(node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    assert sbx.get_info().memory_mb == MEMORY_MB
    clock = DeathClock(_sentry_pid(node, sid))
    netns = _netns(node, sid)

    error, latency, lines = _run_until_death(sbx, FILL_MEMORY, clock)
    print(
        f"OOM after {lines} lines (~{lines * 16} MiB written): stream ended "
        f"{latency * 1000:.0f} ms after the sentry died, with {error!r}"
    )
    assert lines > 0  # it streamed before it died
    assert latency <= STREAM_END_S

    _assert_dead(node, sbx, "out of memory")
    assert _gone(node, sid, netns) == []


def test_a_sandbox_whose_runtime_is_killed_ends_its_stream_at_once_and_is_gone(
    node: NodeServer,
) -> None:
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    pid = _sentry_pid(node, sid)
    clock = DeathClock(pid)
    netns = _netns(node, sid)
    streaming = threading.Event()

    def kill_when_streaming() -> None:
        if streaming.wait(30):
            time.sleep(WATCHED_S)
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_streaming, daemon=True)
    killer.start()
    error, latency, lines = _run_until_death(sbx, TICK, clock, on_started=streaming)
    killer.join(5)
    print(
        f"SIGKILL after {lines} lines: stream ended {latency * 1000:.0f} ms after the "
        f"sentry died, with {error!r}"
    )
    assert lines > 0
    assert latency <= STREAM_END_S

    _assert_dead(node, sbx, "killed by SIGKILL")
    assert _gone(node, sid, netns) == []

    # The node serves on: a new sandbox works.
    other = Sandbox.create(timeout=60)
    try:
        assert other.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        other.kill()


def test_a_paused_sandbox_whose_frozen_runtime_dies_is_gone(node: NodeServer) -> None:
    """Paused in memory (frozen, not yet written to disk), its memory is all it has: a death
    then loses it, and the sandbox goes instead of resuming into nothing."""
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    pid = _sentry_pid(node, sid)
    netns = _netns(node, sid)
    assert sbx.pause() is True
    assert Sandbox.get_info(sid).state == "paused"
    time.sleep(WATCHED_S)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STREAM_END_S
    while time.monotonic() < deadline:
        status, _ = _api_get(node, f"/sandboxes/{sid}")
        if status == 404:
            break
        time.sleep(0.05)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sid)
    _assert_dead(node, sbx, "killed by SIGKILL")
    assert _gone(node, sid, netns) == []
