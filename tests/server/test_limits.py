"""Limits at the node's edge (docs/limits.md): bodies refused before they are read, oversize
metadata and heads refused, slow heads timed out, slow connections bounded per client, and the
proxy's 502 when a guest closes or resets under a request. Raw sockets where the SDKs would
hide what is measured (a 413 before the body is sent, a connection closed by the node)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import time
from collections.abc import Iterable, Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor]

HEADER_TIMEOUT_S = 3.0
MAX_SLOW = 8
PROXY_LIMIT = 16 << 20
API_LIMIT = 4 << 20  # the default max_body_bytes
DROP, RESET, SINK = 8101, 8102, 8103

# Three servers in the guest: DROP reads one piece of a request and resets the connection (a
# server that dies mid-upload); RESET answers 200 with a 1 MB Content-Length, sends 1,000 bytes
# and resets; SINK reads a chunked body whole and answers its size.
_GUEST = r"""
import socket, struct, threading, time
def reset(conn):
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
def head(f):
    while f.readline() not in (b"\r\n", b""): pass
def drop(conn):
    conn.recv(4096)
    time.sleep(0.1)
    reset(conn)
def mid_response(conn):
    head(conn.makefile("rb"))
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000)
    time.sleep(0.3)
    reset(conn)
def sink(conn):
    f = conn.makefile("rb")
    head(f)
    total = 0
    while True:
        size = int(f.readline().split(b";")[0], 16)
        if size == 0:
            f.readline(); break
        total += len(f.read(size)); f.readline()
    body = str(total).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    conn.close()
def serve(port, handler):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(64)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=handler, args=(conn,), daemon=True).start()
for port, handler in ((DROP, drop), (RESET, mid_response)):
    threading.Thread(target=serve, args=(port, handler), daemon=True).start()
serve(SINK, sink)
"""


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(max_sandboxes="2", warm_pool_size="0",
                 header_read_timeout_s=str(HEADER_TIMEOUT_S), body_idle_timeout_s="2",
                 max_slow_connections_per_client=str(MAX_SLOW),
                 proxy_max_body_bytes=str(PROXY_LIMIT)) as server:
        yield server


@pytest.fixture(scope="module")
def guest(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=600)
    try:
        script = _GUEST.replace("DROP", str(DROP)).replace("RESET", str(RESET))
        sbx.files.write("/tmp/guest.py", script.replace("SINK", str(SINK)))
        sbx.commands.run("python3 /tmp/guest.py", background=True, timeout=0)
        deadline = time.monotonic() + 30
        while _ask(node, _post_head(sbx.get_host(SINK), chunked=True), [b"0\r\n\r\n"])[0] != 200:
            assert time.monotonic() < deadline, "the guest servers did not start"
            time.sleep(0.3)
        yield sbx
    finally:
        sbx.kill()


def _rss_mb(server: NodeServer) -> float:
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _post_head(host: str, path: str = "/upload", *, length: int | None = None,
               chunked: bool = False, extra: bytes = b"") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"X-API-KEY: {API_KEY}",
             "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return "\r\n".join(lines).encode() + b"\r\n" + extra + b"\r\n"


def _chunks(total: int, size: int = 65_536, *, chunked: bool) -> Iterator[bytes]:
    piece = b"x" * size
    for _ in range(total // size):
        yield b"%x\r\n%s\r\n" % (size, piece) if chunked else piece


def _parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return status, {k.lower(): v for k, v in headers.items()}, body


def _ask(server: NodeServer, head: bytes, body: Iterable[bytes], *,
         source: str = "127.0.0.1", timeout: float = 20) -> tuple[int, dict[str, str], bytes]:
    """Send ``head``, then ``body`` piece by piece until the node answers (or stops reading);
    the answer as read until the node closes the connection or ``timeout``."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(timeout)
    sock.connect((server.host, server.port))
    answer = b""
    with sock:
        sock.sendall(head)
        for piece in body:
            if select.select([sock], [], [], 0)[0]:
                break  # answered before the whole body was sent
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while time.monotonic() < deadline:
                data = sock.recv(65_536)
                if not data:
                    break
                answer += data
                _, headers, got = _parse(answer)
                if "content-length" in headers and len(got) >= int(headers["content-length"]):
                    break
    return _parse(answer)


def _e2b_error(body: bytes, status: int) -> dict[str, object]:
    parsed = json.loads(body)
    assert parsed["code"] == status and isinstance(parsed["message"], str), parsed
    return dict(parsed)


def test_oversize_body_is_refused_before_it_is_read(node: NodeServer) -> None:
    before = _rss_mb(node)
    total = 300 << 20
    started = time.monotonic()
    status, headers, body = _ask(node, _post_head("api", "/v2/sandboxes", length=total),
                                 _chunks(total, 1 << 20, chunked=False))
    elapsed = time.monotonic() - started
    assert status == 413, (status, body[:200])
    _e2b_error(body, 413)
    assert headers.get("connection") == "close"
    assert elapsed < 5, f"the 413 took {elapsed:.1f} s"
    # Chunked: no length to refuse by; cut off once past the limit.
    status, headers, body = _ask(node, _post_head("api", "/v2/sandboxes", chunked=True),
                                 _chunks(total, chunked=True))
    assert status == 413, (status, body[:200])
    _e2b_error(body, 413)
    grown = _rss_mb(node) - before
    assert grown < 50, f"the node's RSS grew {grown:.0f} MB"


def test_a_body_that_stops_arriving_is_answered_408(node: NodeServer) -> None:
    status, _, body = _ask(node, _post_head("api", "/v2/sandboxes", length=100), [b"{"],
                           timeout=10)
    assert status == 408, (status, body[:200])
    _e2b_error(body, 408)


def test_oversize_metadata_and_env_vars_are_400(node: NodeServer) -> None:
    url = f"{node.url}/v2/sandboxes"
    big = {f"key{i}": "v" * 1000 for i in range(2000)}  # 2 MB, 2,000 keys
    cases = [{"metadata": big}, {"metadata": {"k" * 300: "v"}},
             {"envVars": {"A": "x" * 200_000}}, {"envVars": {f"V{i}": "1" for i in range(1001)}}]
    for extra in cases:
        answer = httpx.post(url, json={"templateID": "base", **extra},
                            headers={"X-API-KEY": API_KEY}, timeout=60)
        assert answer.status_code == 400, (list(extra), answer.status_code, answer.text[:200])
        _e2b_error(answer.content, 400)


def test_slow_head_is_timed_out(node: NodeServer) -> None:
    with socket.create_connection((node.host, node.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\n")
        answer = b""
        # One header line every 0.3 s: each arrives well inside any per-read timeout.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while time.monotonic() - started < 8:
                if select.select([sock], [], [], 0.3)[0]:
                    data = sock.recv(65_536)
                    answer += data
                    if not data:
                        break
                sock.sendall(b"X-Slow: 1\r\n")
        elapsed = time.monotonic() - started
    assert elapsed < HEADER_TIMEOUT_S + 2, f"a slow head held its connection {elapsed:.1f} s"
    status, _, body = _parse(answer)
    assert status == 408
    _e2b_error(body, 408)
    # A connection that never sends a byte is closed too.
    with socket.create_connection((node.host, node.port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2


def test_oversize_head_is_431(node: NodeServer) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 200_000 + b"\r\n\r\n"
    status, _, body = _ask(node, head, [])
    assert status == 431, (status, body[:200])
    _e2b_error(body, 431)
    # One header a little under the limit is fine.
    head = b"GET /health HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 60_000 + b"\r\n\r\n"
    assert _ask(node, head, [])[0] == 200


def test_slow_connections_are_bounded_per_client(node: NodeServer) -> None:
    slow: list[socket.socket] = []
    try:
        for _ in range(MAX_SLOW):
            sock = socket.create_connection((node.host, node.port), timeout=5)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\n")
            slow.append(sock)
        time.sleep(1.2)  # they are slow now (SLOW_AFTER_S)
        # One more of the same client replaces the oldest, and is served.
        status, _, _ = _ask(node, b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", [])
        assert status == 200
        status, _, body = _parse(slow[0].recv(65_536))
        assert status == 408, (status, body[:200])
        _e2b_error(body, 408)
        # Another client is served meanwhile.
        started = time.monotonic()
        status, _, _ = _ask(node, b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", [],
                            source="127.0.0.2", timeout=5)
        assert status == 200 and time.monotonic() - started < 2
        # The other slow ones are served when their heads complete (within the timeout).
        for sock in slow[1:]:
            sock.sendall(b"\r\n")
            assert sock.recv(65_536).startswith(b"HTTP/1.1 200")
    finally:
        for sock in slow:
            sock.close()
    # A burst of young connections is let through up to four times the bound, then refused.
    burst: list[socket.socket] = []
    try:
        for _ in range(4 * MAX_SLOW):
            burst.append(socket.create_connection((node.host, node.port), timeout=5))
        status, _, body = _ask(node, b"", [], timeout=3)
        assert status == 429, (status, body[:200])
        _e2b_error(body, 429)
    finally:
        for sock in burst:
            sock.close()


def test_proxy_502_when_the_guest_closes_during_a_chunked_upload(
        node: NodeServer, guest: Sandbox) -> None:
    status, _, body = _ask(node, _post_head(guest.get_host(DROP), chunked=True),
                           _chunks(8 << 20, chunked=True))
    assert status == 502, (status, body[:300])
    parsed = _e2b_error(body, 502)
    assert parsed["sandboxId"] == guest.sandbox_id
    # Bodiless too: the guest resets before answering.
    answer = httpx.get(node.url + "/", headers={"Host": guest.get_host(DROP)}, timeout=30)
    assert answer.status_code == 502
    _e2b_error(answer.content, 502)
    assert "Traceback" not in node.log() and "Exception in ASGI" not in node.log()


def test_proxy_cuts_the_stream_when_the_guest_resets_mid_response(
        node: NodeServer, guest: Sandbox) -> None:
    status, headers, body = _ask(
        node, f"GET / HTTP/1.1\r\nHost: {guest.get_host(RESET)}\r\n\r\n".encode(), [])
    assert status == 200 and headers["content-length"] == "1000000"
    assert 0 < len(body) < 1_000_000  # cut, never ended as if whole
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(node.url + "/", headers={"Host": guest.get_host(RESET)}, timeout=30)
    log = node.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log
    assert "without completing response" not in log


def test_proxy_body_limit_and_large_uploads(node: NodeServer, guest: Sandbox) -> None:
    host = guest.get_host(SINK)
    # Larger than the API's limit: sandbox traffic has its own.
    status, _, body = _ask(node, _post_head(host, chunked=True),
                           [*_chunks(2 * API_LIMIT, chunked=True), b"0\r\n\r\n"])
    assert (status, body) == (200, str(2 * API_LIMIT).encode())
    data = os.urandom(6 << 20)
    guest.files.write("/tmp/big.bin", data)
    assert guest.commands.run("stat -c %s /tmp/big.bin").stdout.strip() == str(len(data))
    # Past the proxy's: refused by its length, or cut off while streaming.
    status, _, body = _ask(node, _post_head(host, length=PROXY_LIMIT + 1), [])
    assert status == 413
    _e2b_error(body, 413)
    status, _, body = _ask(node, _post_head(host, chunked=True),
                           _chunks(2 * PROXY_LIMIT, chunked=True))
    assert status == 413, (status, body[:200])
    _e2b_error(body, 413)
