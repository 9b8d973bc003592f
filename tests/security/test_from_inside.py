"""Escape attempts from inside a sandbox, as root unless said otherwise: each must fail.

Real node, real gVisor, the e2b SDK. Most of these held when they were written; they guard
against regressions. docs/security.md lists what the suite covers.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import SandboxException, TimeoutException

from tests.network.peers import ECHO_PORT, HostListener, InternetPeer, LanPeer
from tests.security.probes import host_addresses, probe, return_addresses
from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


@pytest.fixture
def marker() -> str:
    return f"aenv-escape-{secrets.token_hex(8)}"


def _sh(sbx: Sandbox, script: str, **kwargs: object) -> str:
    """Run ``script`` in the sandbox; its output whatever the exit code."""
    try:
        return sbx.commands.run(script, timeout=60, **kwargs).stdout  # type: ignore[arg-type]
    except CommandExitException as exc:
        return exc.stdout + exc.stderr


# ---------------------------------------------------------------- host files and processes


def test_host_files_are_out_of_reach(sandbox: Sandbox, server: NodeServer, marker: str) -> None:
    secret = secrets.token_hex(16)
    host_file = Path("/tmp") / marker
    host_file.write_text(secret)
    try:
        out = _sh(
            sandbox,
            "; ".join(
                [
                    f"cat {host_file}",
                    f"cat /proc/1/root{host_file}",
                    f"cat /proc/self/root/../../..{host_file}",
                    f"for p in /proc/[0-9]*; do cat $p/root{host_file} $p/cwd{host_file}; done",
                    f"grep -rs {secret} /tmp /proc/1/root/tmp /run /var/tmp",
                    f"ls -d {server.home} /work /var/cache/aenv-test /run/netns",
                    # A block device of the host's disk would let a root reader see every host file.
                    "ls /dev | grep -E '^(sd|vd|nvme|xvd|loop|dm-)'",
                    "mount -t proc proc /mnt && cat /mnt/1/root/etc/hostname",
                ]
            ),
        )
        assert secret not in out
        assert str(server.home) not in out.replace(f"cannot access '{server.home}'", "")
        assert "/run/netns" not in out.replace("cannot access '/run/netns'", "")
        # The file is still the host's own: nothing inside wrote through to it either.
        _sh(sandbox, f"echo owned > {host_file}; echo owned > /proc/1/root{host_file}")
        assert host_file.read_text() == secret
    finally:
        host_file.unlink()


def test_host_processes_are_invisible_and_unkillable(sandbox: Sandbox, marker: str) -> None:
    host_proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", marker],
        stdin=subprocess.DEVNULL,
    )
    try:
        # The marker is spelt in two parts, so the command's own command line does not hold it.
        head, tail = marker[:6], marker[6:]
        out = _sh(
            sandbox,
            "; ".join(
                [
                    f"m={head}''{tail}",
                    "ps -e -o pid=,args=",
                    "cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
                    f"kill -9 {host_proc.pid}",
                    'pkill -9 -f "$m"',
                ]
            ),
        )
        assert marker not in out
        # Every process the sandbox's root can signal at once: the host's must not be one.
        _sh(sandbox, "kill -9 -1; true")
        assert host_proc.poll() is None, "a process on the host died"
    finally:
        host_proc.kill()
        host_proc.wait()


# ---------------------------------------------------------------- the node, the host, neighbours


def test_the_node_api_is_unreachable(sandbox: Sandbox, server: NodeServer) -> None:
    targets = [f"{ip}:{server.port}" for ip in host_addresses()]
    result = probe(sandbox, f"127.0.0.1:{server.port}", *targets)
    # Its own loopback: refused by the sandbox's own stack, never the node's.
    assert result.pop(f"127.0.0.1:{server.port}") == "ConnectionRefusedError"
    assert set(result.values()) == {"timeout"}, result


def test_host_loopback_services_are_unreachable(sandbox: Sandbox) -> None:
    loopback = socket.socket()
    loopback.bind(("127.0.0.1", 0))
    loopback.listen()
    loopback.setblocking(False)
    port = loopback.getsockname()[1]
    everywhere = HostListener()
    try:
        result = probe(
            sandbox,
            f"127.0.0.1:{port}",
            f"127.0.0.1:{everywhere.port}",
            *(f"{ip}:{p}" for ip in host_addresses() for p in (port, everywhere.port)),
        )
        assert result.pop(f"127.0.0.1:{port}") == "ConnectionRefusedError"
        assert result.pop(f"127.0.0.1:{everywhere.port}") == "ConnectionRefusedError"
        assert set(result.values()) == {"timeout"}, result
        with pytest.raises(BlockingIOError):
            loopback.accept()
        assert everywhere.accepted() == 0
    finally:
        loopback.close()
        everywhere.close()


@pytest.fixture
def neighbour(server: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("python3 -m http.server 8000 --bind 0.0.0.0", background=True)
        sbx.commands.run(
            "for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null "
            "&& break; sleep 0.1; done"
        )
        yield sbx
    finally:
        sbx.kill()


def test_neighbours_and_their_envd_are_unreachable(
    sandbox: Sandbox, neighbour: Sandbox, server: NodeServer
) -> None:
    """Every guest has the same address, so "the neighbour's address" from inside is the
    sandbox itself; the ways that could lead elsewhere are the host's addresses and the
    slots' return addresses (how the host routes replies to each slot)."""
    returns = return_addresses(server)
    assert len(returns) >= 2, "the node has a slot per sandbox"
    targets = [f"{ip}:{port}" for ip in [*host_addresses(), *returns] for port in (8000, 49983)]
    result = probe(sandbox, *targets)
    assert set(result.values()) == {"timeout"}, result
    # The neighbour's server is up (seen from inside it), so the timeouts above are the rules.
    assert probe(neighbour, "127.0.0.1:8000") == {"127.0.0.1:8000": "connected"}


# ---------------------------------------------------------------- private and node ranges


def test_private_and_node_networks_are_unreachable(
    sandbox: Sandbox, lan: LanPeer, internet: InternetPeer
) -> None:
    """Issue 21 item 9: the node's LAN (a range on no fixed list), the host's address on it
    and the node's gateways are denied; the internet behind the gateway is not."""
    lan_server, public = f"{lan.ip}:{ECHO_PORT}", f"{internet.ip}:{ECHO_PORT}"
    denied = [
        lan_server,
        f"{lan.host_ip}:{ECHO_PORT}",
        f"{internet.router_ip}:{ECHO_PORT}",
        f"{internet.private_ip}:{ECHO_PORT}",
    ]
    result = probe(sandbox, public, *denied)
    assert result == {public: "connected", **dict.fromkeys(denied, "timeout")}


def test_allow_out_does_not_open_the_node_networks(
    server: NodeServer, lan: LanPeer, internet: InternetPeer
) -> None:
    sbx = Sandbox.create(
        timeout=120, network={"allow_out": [lan.subnet, internet.router_ip, "0.0.0.0/0"]}
    )
    try:
        lan_server, router = f"{lan.ip}:{ECHO_PORT}", f"{internet.router_ip}:{ECHO_PORT}"
        assert probe(sbx, lan_server, router) == {lan_server: "timeout", router: "timeout"}
        sbx.update_network({"allow_out": [lan.ip]})  # type: ignore[typeddict-item]
        assert probe(sbx, lan_server) == {lan_server: "timeout"}
    finally:
        sbx.kill()


# ---------------------------------------------------------------- raw sockets, spoofing

RAW = r"""
import json, socket
out = {}
for name, args in {
    "inet_raw_icmp": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "inet_raw_tcp": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
    "inet_raw_ip": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
    "packet_raw": (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
    "packet_dgram": (socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300),
}.items():
    try:
        socket.socket(*args).close(); out[name] = "opened"
    except OSError as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""

SPOOF = r"""
import json, socket, sys
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {}
for opt in ("IP_FREEBIND", "IP_TRANSPARENT"):
    s = socket.socket(); s.settimeout(2)
    try:
        s.setsockopt(socket.IPPROTO_IP, getattr(socket, opt, 15 if opt == "IP_FREEBIND" else 19), 1)
        s.bind((src, 0)); s.connect((dst, port)); out[opt] = "connected"
    except OSError as e:
        out[opt] = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
    finally:
        s.close()
print(json.dumps(out))
"""


def test_raw_sockets_and_spoofed_sources_go_nowhere(
    sandbox: Sandbox, internet: InternetPeer
) -> None:
    sandbox.files.write("/tmp/raw.py", RAW)
    raw = json.loads(sandbox.commands.run("python3 /tmp/raw.py", timeout=30).stdout)
    assert "opened" not in raw.values(), raw
    # A connection from an address that is not the guest's (another sandbox's return address,
    # an address of the internet's own) never leaves the slot.
    sandbox.files.write("/tmp/spoof.py", SPOOF)
    for source in ("198.18.0.1", internet.ip):
        out = sandbox.commands.run(
            f"python3 /tmp/spoof.py {source} {internet.ip} {ECHO_PORT}", timeout=30
        ).stdout
        assert "connected" not in json.loads(out).values(), (source, out)


# ---------------------------------------------------------------- privilege


def test_a_user_without_sudo_cannot_become_root(sandbox: Sandbox) -> None:
    for command in ("sudo -n id -u", "setpriv --reuid 12345 sudo -n id -u"):
        try:
            # nobody's home (/nonexistent) is no directory: run it from /tmp.
            out = sandbox.commands.run(command, user="nobody", cwd="/tmp",
                                       timeout=20).stdout.strip()
        except CommandExitException:
            continue
        assert out != "0", command


def test_files_as_user_cannot_read_shadow(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException) as refused:
        sandbox.files.read("/etc/shadow", user="user")
    assert not isinstance(refused.value, TimeoutException)
