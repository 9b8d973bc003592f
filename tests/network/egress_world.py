"""A small internet for the egress tests, inside the internet peer's network namespace
(peers.py): two web servers, each on an address of its own and each speaking HTTP on 80 and
HTTPS on 443 (a certificate for ``CERTIFIED`` from a CA made here, ``World.ca_file``), and
a DNS server that knows their names. Nothing leaves the machine.

Names (``NAMES``): ``allowed.test`` and ``sub.wild.test`` and ``wild.test`` → server A,
``denied.test`` → server B; anything else is NXDOMAIN.
"""

from __future__ import annotations

import contextlib
import hashlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.certs import issue
from tests.network.peers import InternetPeer, sh

WEB_SERVER = r"""
import hashlib, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
address, body, cert, key, seen, status = (sys.argv[1], sys.argv[2].encode(), sys.argv[3],
                                          sys.argv[4], sys.argv[5], int(sys.argv[6]))
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if status != 200:  # a public address's stand-in: its redirect, as the real one
            self.send_response(status); self.send_header("Location", "https://example.test/")
            self.send_header("Content-Length", "0"); self.end_headers()
            return
        if self.path.startswith("/bulk?"):  # n bytes (bench/egress_bench.py)
            size = int(self.path.split("?")[1])
            self.send_response(200); self.send_header("Content-Length", str(size))
            self.end_headers()
            block = b"x" * (1 << 20)
            while size > 0:
                self.wfile.write(block[:min(size, len(block))]); size -= len(block)
            return
        out = body + b" " + (self.headers.get("Host") or "").encode()
        if self.headers.get("X-Api-Key"):
            # A digest, not the key: what answers a sandbox must not carry the secret in.
            key = self.headers["X-Api-Key"].encode()
            out += b" key=" + hashlib.sha256(key).hexdigest()[:16].encode()
        if self.headers.get("Authorization"):  # kept for the test, never answered
            with open(seen, "a") as log:
                log.write(self.headers["Authorization"] + "\n")
            out += b" authorized"
        self.send_response(200); self.send_header("Content-Length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *args):
        pass
plain = ThreadingHTTPServer((address, 80), H)
tls = ThreadingHTTPServer((address, 443), H)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain(cert, key)
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", flush=True)
plain.serve_forever()
"""

DNS_SERVER = r"""
import socket, sys
import dns.message, dns.rcode, dns.rrset, dns.rdatatype
address, table = sys.argv[1], dict(p.split("=") for p in sys.argv[2].split(","))
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); sock.bind((address, 53))
print("ready", flush=True)
while True:
    data, peer = sock.recvfrom(4096)
    query = dns.message.from_wire(data)
    answer = dns.message.make_response(query)
    name = query.question[0].name.to_text(omit_final_dot=True)
    if name in table and query.question[0].rdtype == dns.rdatatype.A:
        answer.answer.append(dns.rrset.from_text(query.question[0].name, 60, "IN", "A",
                                                 table[name]))
    elif name not in table:
        answer.set_rcode(dns.rcode.NXDOMAIN)
    sock.sendto(answer.to_wire(), peer)
"""


def key_digest(value: str) -> str:
    """What the web servers answer for an ``X-Api-Key`` of ``value``."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class World:
    a_ip: str
    b_ip: str
    dns_ip: str
    #: Every ``Authorization`` header the servers were sent, a line each.
    authorizations: Path
    #: The CA the servers' certificate is signed by (PEM file; the node is told to trust it
    #: for its side of an intercepted connection, as it trusts a public CA).
    ca_file: Path

    def names(self) -> dict[str, str]:
        return {"allowed.test": self.a_ip, "wild.test": self.a_ip,
                "sub.wild.test": self.a_ip, "denied.test": self.b_ip}


SOCKS_PORT = 1080

#: Public addresses E2B's own SDK tests reach, stood up here with the status their real
#: servers answer ``curl https://<address>`` with (``egress_world(public=True)``).
PUBLIC = {"1.1.1.1": 301, "8.8.8.8": 302}

#: The names the servers' certificate is for: ``wild.test`` is left out, so that a client
#: checking a connection to it fails (a host whose certificate is not its own).
CERTIFIED = ("allowed.test", "sub.wild.test", "denied.test")


def _start(netns: str, code: str, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{netns}", "--", sys.executable, "-c", code, *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", f"{code[:40]} did not start"
    return process


@contextlib.contextmanager
def egress_world(peer: InternetPeer, *, public: bool = False) -> Iterator[World]:
    """Servers A and B and the DNS server, on addresses added to ``peer`` for the test;
    ``public``: the stand-ins of ``PUBLIC`` too (routed to ``peer`` from the host while the
    world stands: the host's own traffic to them stays on the machine as well)."""
    added = [f"198.51.100.{peer.tag + 64}", f"198.51.100.{peer.tag + 192}"]
    if public:
        added += list(PUBLIC)
    processes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="aenv-egress-") as scratch:
        Path(scratch).chmod(0o755)
        cert, key, ca = issue(Path(scratch), CERTIFIED, PUBLIC, ca_name="egress test world CA")
        seen = Path(scratch) / "authorizations"
        seen.touch()
        seen.chmod(0o666)
        world = World(a_ip=added[0], b_ip=added[1], dns_ip=peer.ip, ca_file=ca,
                      authorizations=seen)
        try:
            for address in added:
                sh("ip", "-n", peer.netns, "addr", "add", f"{address}/32", "dev", "eth0")
                sh("ip", "route", "replace", f"{address}/32", "via", peer.router_ip,
                   "dev", peer.host_ifname)
            servers = [(world.a_ip, "A", 200), (world.b_ip, "B", 200)]
            servers += [(a, a, PUBLIC[a]) for a in added if a in PUBLIC]
            for address, name, status in servers:
                processes.append(_start(peer.netns, WEB_SERVER, address, name, str(cert),
                                        str(key), str(seen), str(status)))
            table = ",".join(f"{k}={v}" for k, v in world.names().items())
            processes.append(_start(peer.netns, DNS_SERVER, world.dns_ip, table))
            yield world
        finally:
            for process in processes:
                process.kill()
                process.wait()
            for address in added:
                sh("ip", "route", "del", f"{address}/32", check=False)
                sh("ip", "-n", peer.netns, "addr", "del", f"{address}/32", "dev", "eth0",
                   check=False)


@contextlib.contextmanager
def socks5(peer: InternetPeer, username: str, password: str) -> Iterator[str]:
    """A real SOCKS5 server (Debian's microsocks) in ``peer``'s namespace, with a username and
    password: its ``host:port``."""
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{peer.netns}", "--", "microsocks", "-i", peer.ip,
         "-p", str(SOCKS_PORT), "-u", username, "-P", password],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while "LISTEN" not in subprocess.run(
                ["nsenter", f"--net=/run/netns/{peer.netns}", "--", "ss", "-Hltn",
                 f"sport = :{SOCKS_PORT}"], capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "microsocks did not listen"
            time.sleep(0.05)
        yield f"{peer.ip}:{SOCKS_PORT}"
    finally:
        server.kill()
        server.wait()
