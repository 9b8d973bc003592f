"""A sandbox is isolated from the node and from its neighbours (issue: node server)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.settimeout(2)
try:
    s.connect((host, port)); print("CONNECTED")
except OSError as e:
    print("BLOCKED", type(e).__name__)
"""


def _host_ips() -> list[str]:
    ips = {"169.254.0.22"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no traffic: only picks the outgoing address
            ips.add(s.getsockname()[0])
        except OSError:
            pass
    return sorted(ips)


@pytest.fixture
def pair(server: NodeServer) -> Iterator[tuple[Sandbox, Sandbox]]:
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120)
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def _probe(sbx: Sandbox, host: str, port: int) -> str:
    sbx.files.write("/tmp/probe.py", PROBE)
    return sbx.commands.run(f"python3 /tmp/probe.py {host} {port}", timeout=20).stdout.strip()


def test_cannot_see_host_processes_or_files(sandbox: Sandbox) -> None:
    ps = sandbox.commands.run("ps -e -o comm=").stdout.split()
    assert "python3" not in ps or len(ps) < 20
    assert "runsc" not in ps and "uvicorn" not in " ".join(ps)
    assert sandbox.commands.run("test -e /work/main && echo leak || echo ok").stdout == "ok\n"
    assert sandbox.commands.run("cat /proc/1/cmdline | tr '\\0' ' '").stdout.startswith(
        "/opt/aenv/envd"
    )


def test_cannot_reach_the_node_api(sandbox: Sandbox, server: NodeServer) -> None:
    for ip in _host_ips():
        assert _probe(sandbox, ip, server.port).startswith("BLOCKED"), ip
    assert _probe(sandbox, "127.0.0.1", server.port).startswith("BLOCKED")


def test_cannot_reach_a_host_listener_on_any_address(sandbox: Sandbox) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]
    accepted: list[object] = []
    listener.settimeout(0.2)

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        for ip in _host_ips():
            assert _probe(sandbox, ip, port).startswith("BLOCKED"), ip
    finally:
        thread.join()
        listener.close()
    assert not accepted


def test_cannot_reach_a_neighbour(pair: tuple[Sandbox, Sandbox]) -> None:
    a, b = pair
    b.commands.run("python3 -m http.server 8000 --bind 0.0.0.0", background=True)
    b.commands.run("for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && "
                   "break; sleep 0.1; done")
    # Every sandbox has the same guest address, so "B's address" from A is A itself.
    for ip in ["169.254.0.21", *_host_ips()]:
        assert _probe(a, ip, 8000).startswith("BLOCKED"), ip


def test_fork_bomb_and_memory_hog_leave_neighbours_working(
    pair: tuple[Sandbox, Sandbox],
) -> None:
    a, b = pair
    # One command starts both: the bomb alone may take A down (out of memory, the sandbox
    # ends: designed) before a second command reaches it.
    a.commands.run(
        "python3 -c 'x = []\nwhile True: x.append(bytearray(50_000_000))' & "
        "bomb() { bomb | bomb & }; bomb",
        background=True, timeout=30,
    )
    for _ in range(5):
        assert b.commands.run("echo alive", timeout=20).stdout == "alive\n"
