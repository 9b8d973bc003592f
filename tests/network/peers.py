"""Test peers for network tests: a netns that plays "the internet", and small helpers.

Nothing here sends a packet to a real external or private address. "The internet" is a netns
behind a router: the host reaches the netns through a veth with a TEST-NET-3 link
(203.0.113.0/30s, RFC 5737), and the echo server's address (a TEST-NET-2 /32, 198.51.100.128
and up) is routed via the far end of that link, as the real internet is via a default gateway:
the node denies the subnets on its interfaces and their gateways (node_nets.py), not what lies
behind them. The one "private" address the tests use (10.255.255.x, one per peer) is routed
the same way into that netns, so a broken isolation rule would deliver to our peer, never off
the machine.

"The LAN" (``LanPeer``) is the other case: a netns on a subnet of the host's own
(198.51.100.0/30s below .128, on no fixed list), which sandboxes must never reach.

Names never match the slot patterns (``aenv-<n>``, ``aenv-h<n>``), so no sweeper takes them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: An echo server that first reports the address it sees the client at.
ECHO_SERVER = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(128)
print("ready", flush=True)
def serve(conn, addr):
    try:
        with conn:
            conn.sendall(f"peer {addr[0]}:{addr[1]}\n".encode())
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                conn.sendall(b"echo " + data)
    except OSError:
        pass  # probes connect and hang up at once
while True:
    conn, addr = srv.accept()
    threading.Thread(target=serve, args=(conn, addr), daemon=True).start()
"""

#: The port the peer's echo server listens on.
ECHO_PORT = 7007


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, input=input, timeout=60
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


@dataclass
class InternetPeer:
    """A netns with an echo server at ``ip:ECHO_PORT`` (and ``private_ip``), routed via the
    host and a router (``router_ip``) like any destination a sandbox reaches through NAT."""

    tag: int = field(default_factory=lambda: os.getpid() % 60)
    server: subprocess.Popen[str] | None = None

    @property
    def netns(self) -> str:
        return f"aenvtest-inet{self.tag}"

    @property
    def host_ifname(self) -> str:
        return f"aenvti{self.tag}"

    @property
    def host_ip(self) -> str:
        """The host's address towards the peer (the masquerade source)."""
        return f"203.0.113.{4 * self.tag + 1}"

    @property
    def router_ip(self) -> str:
        """The far end of the host's link (a gateway of the node's: denied to sandboxes)."""
        return f"203.0.113.{4 * self.tag + 2}"

    @property
    def ip(self) -> str:
        """The echo server's address, behind ``router_ip``."""
        return f"198.51.100.{128 + self.tag}"

    @property
    def private_ip(self) -> str:
        """A private address routed into the peer (only by a /32 route, only while tests
        run); one per peer, so test processes side by side do not share its route."""
        return f"10.255.255.{2 + self.tag}"

    def start(self) -> None:
        self.stop()  # leftovers of a crashed run with the same tag
        try:
            self._start()
        except BaseException:
            self.stop()  # a half-made peer would fail every later start with "File exists"
            raise

    def _start(self) -> None:
        sh("ip", "netns", "add", self.netns)
        sh(
            "ip", "-batch", "-",
            input="\n".join([
                f"link add {self.host_ifname} type veth peer name eth0 netns {self.netns}",
                f"addr add {self.host_ip}/30 dev {self.host_ifname}",
                f"link set {self.host_ifname} up",
                f"route add {self.ip}/32 via {self.router_ip} dev {self.host_ifname}",
                f"route add {self.private_ip}/32 via {self.router_ip} dev {self.host_ifname}",
            ]) + "\n",
        )
        sh(
            "ip", "-n", self.netns, "-batch", "-",
            input="\n".join([
                f"addr add {self.router_ip}/30 dev eth0",
                f"addr add {self.ip}/32 dev eth0",
                f"addr add {self.private_ip}/32 dev eth0",
                "link set eth0 up",
                "link set lo up",
            ]) + "\n",
        )
        self.server = subprocess.Popen(
            # nsenter, not ``ip netns exec``: that one makes a mount namespace, a copy of every
            # mount of the machine, which would pin the disk workspaces of every node's
            # sandboxes mounted at the time for as long as this server lives.
            ["nsenter", f"--net=/run/netns/{self.netns}", "--", sys.executable, "-c",
             ECHO_SERVER, str(ECHO_PORT)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
        )
        assert self.server.stdout is not None
        assert self.server.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None
        if Path(f"/sys/class/net/{self.host_ifname}").exists():
            sh("ip", "link", "del", self.host_ifname, check=False)
        if Path(f"/run/netns/{self.netns}").exists():
            sh("ip", "netns", "del", self.netns, check=False)


@dataclass
class LanPeer:
    """The node's LAN: a netns on a subnet of the host's own (``subnet``, host side
    ``host_ip``), an echo server at ``ip:ECHO_PORT``. In no fixed range of nft.py."""

    tag: int = field(default_factory=lambda: os.getpid() % 32)
    server: subprocess.Popen[str] | None = None

    @property
    def netns(self) -> str:
        return f"aenvtest-lan{self.tag}"

    @property
    def host_ifname(self) -> str:
        return f"aenvtl{self.tag}"

    @property
    def subnet(self) -> str:
        return f"198.51.100.{4 * self.tag}/30"

    @property
    def host_ip(self) -> str:
        return f"198.51.100.{4 * self.tag + 1}"

    @property
    def ip(self) -> str:
        return f"198.51.100.{4 * self.tag + 2}"

    def start(self) -> None:
        self.stop()
        try:
            sh("ip", "netns", "add", self.netns)
            sh(
                "ip", "-batch", "-",
                input="\n".join([
                    f"link add {self.host_ifname} type veth peer name eth0 netns {self.netns}",
                    f"addr add {self.host_ip}/30 dev {self.host_ifname}",
                    f"link set {self.host_ifname} up",
                ]) + "\n",
            )
            sh(
                "ip", "-n", self.netns, "-batch", "-",
                input=f"addr add {self.ip}/30 dev eth0\nlink set eth0 up\nlink set lo up\n",
            )
            self.server = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.netns}", "--", sys.executable, "-c",
                 ECHO_SERVER, str(ECHO_PORT)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
            )
            assert self.server.stdout is not None
            assert self.server.stdout.readline().strip() == "ready"
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None
        if Path(f"/sys/class/net/{self.host_ifname}").exists():
            sh("ip", "link", "del", self.host_ifname, check=False)
        if Path(f"/run/netns/{self.netns}").exists():
            sh("ip", "netns", "del", self.netns, check=False)


def host_primary_ip() -> str:
    """The address the host uses on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        return str(s.getsockname()[0])


class HostListener:
    """A TCP listener on every host address; counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port: int = self.sock.getsockname()[1]

    def accepted(self) -> int:
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = self.sock.accept()
                conn.close()
                count += 1
        return count

    def close(self) -> None:
        self.sock.close()


def wait_gone(path: Path, timeout: float = 10.0) -> bool:
    """Netns teardown is asynchronous in the kernel: wait for ``path`` to disappear."""
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not path.exists()


#: Run inside a guest: try to connect to each ``host:port`` argument (in parallel), print a JSON
#: object target → "connected" | exception name. Blocked traffic is dropped, not rejected, so a
#: block shows as "timeout".
PROBE = r"""
import json, socket, sys, threading
result = {}
def probe(target):
    host, port = target.rsplit(":", 1)
    s = socket.socket(); s.settimeout(float(sys.argv[1]))
    try:
        s.connect((host, int(port))); result[target] = "connected"
    except Exception as e:
        result[target] = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
    finally:
        s.close()
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[2:]]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(result))
"""

#: Run inside a guest: from source port argv[1], connect to argv[2]:argv[3], read the peer's
#: greeting, hold the connection argv[4] seconds, send argv[5], print greeting and echo as JSON.
HOLD = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.settimeout(10)
s.connect((sys.argv[2], int(sys.argv[3])))
f = s.makefile("rb")
greeting = f.readline().decode().strip()
time.sleep(float(sys.argv[4]))
s.sendall(sys.argv[5].encode() + b"\n")
echo = f.readline().decode().strip()
print(json.dumps({"greeting": greeting, "echo": echo}))
"""

#: Run inside a guest: an HTTP server on argv[1] answering every GET with argv[2].
HTTP_SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
body = sys.argv[2].encode()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"""
