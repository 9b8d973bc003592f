"""The proxy's HTTP relay: keep-alive reuse of guest connections, streaming both ways, and
that a pause closes every pooled connection into the sandbox (proxy/forward.py,
network/guest_pool.py). Untimed: ordering is proved by handshakes, not by clocks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor]

PORT = 8081

# An HTTP/1.1 server in the guest (threads, keep-alive): ``/port`` answers the client's source
# port, ``/open`` how many connections are open; ``POST /upload`` (chunked) records bytes as
# they arrive (``/seen``); ``/stream`` sends "first", then waits for ``/release``.
_GUEST = r"""
import http.server, threading
state = {"open": 0, "seen": 0}
lock = threading.Lock()
release = threading.Event()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def setup(self):
        super().setup()
        with lock: state["open"] += 1
    def finish(self):
        super().finish()
        with lock: state["open"] -= 1
    def log_message(self, *a): pass
    def reply(self, text):
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/port": return self.reply(str(self.client_address[1]))
        if self.path == "/open": return self.reply(str(state["open"]))
        if self.path == "/seen": return self.reply(str(state["seen"]))
        if self.path == "/release":
            release.set(); return self.reply("ok")
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"first\n", b"second\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part)); self.wfile.flush()
                release.wait(60)
            self.wfile.write(b"0\r\n\r\n")
    def do_POST(self):
        total = 0
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline(); break
            total += len(self.rfile.read(size)); self.rfile.readline()
            with lock: state["seen"] = total
        self.reply(str(total))
http.server.ThreadingHTTPServer(("0.0.0.0", PORT), H).serve_forever()
"""


@pytest.fixture
def guest(server: NodeServer) -> Iterator[tuple[Sandbox, httpx.Client]]:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/guest.py", _GUEST.replace("PORT", str(PORT)))
        sbx.commands.run("python3 /tmp/guest.py", background=True, timeout=0)
        client = httpx.Client(base_url=server.url, headers={"Host": sbx.get_host(PORT)},
                              timeout=30)
        deadline = time.monotonic() + 30
        while client.get("/open").status_code != 200:
            assert time.monotonic() < deadline, "the guest server did not start"
            time.sleep(0.2)
        yield sbx, client
        client.close()
    finally:
        sbx.kill()


def test_keep_alive_connections_are_reused(guest: tuple[Sandbox, httpx.Client]) -> None:
    _, client = guest
    ports = {client.get("/port").text for _ in range(20)}
    assert len(ports) == 1  # one guest connection served 20 sequential requests
    # Concurrent requests open more, and those stay pooled too.
    with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=30) as other:
        for _ in range(5):
            assert client.get("/port").status_code == other.get("/port").status_code == 200
    assert int(client.get("/open").text) <= 2


def test_streams_both_ways(guest: tuple[Sandbox, httpx.Client]) -> None:
    _, client = guest
    # Upload: the second chunk is only produced once the guest has seen the first one.
    def body() -> Iterator[bytes]:
        yield b"a" * 1000
        deadline = time.monotonic() + 20
        with httpx.Client(base_url=client.base_url, headers=client.headers) as probe:
            while probe.get("/seen").text != "1000":
                assert time.monotonic() < deadline, "the first chunk never reached the guest"
                time.sleep(0.05)
        yield b"b" * 500
    assert client.post("/upload", content=body()).text == "1500"
    # Download: "first" arrives while the guest still holds "second" back.
    with client.stream("GET", "/stream") as response:
        lines = response.iter_lines()
        assert next(lines) == "first"
        release = threading.Thread(target=lambda: client.get("/release"))
        release.start()
        assert next(lines) == "second"
        # Before the client closes (at the fixture's end), or the release has its socket
        # closed under it.
        release.join(30)


def test_pause_closes_pooled_connections(guest: tuple[Sandbox, httpx.Client]) -> None:
    sbx, client = guest
    with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=30) as other:
        for _ in range(3):
            client.get("/port")
            other.get("/port")
    assert sbx.pause() is True
    assert client.get("/port").status_code == 502  # paused: "not found", as E2B says
    Sandbox.connect(sbx.sandbox_id)
    # Only the connection of this very request stays open: the pool's were closed at the
    # pause (the guest may see their FINs only once thawed, hence the wait).
    deadline = time.monotonic() + 20
    while (still := client.get("/open").text) != "1":
        assert time.monotonic() < deadline, f"{still} guest connections still open"
        time.sleep(0.1)
    sbx.kill()
    gone = client.get("/port")
    assert gone.status_code == 502
    assert gone.json()["message"] == "The sandbox was not found"
