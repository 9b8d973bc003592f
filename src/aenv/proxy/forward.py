"""Forward one HTTP request to a guest port and stream the answer back, both ways unbuffered.

HTTP/1.1 is written and parsed here over a pooled keep-alive connection (network/guest_pool.py)
instead of through an httpx client: a request costs a header join and a split, no per-request
client objects. Request bodies are passed on as they arrive (chunked uploads, Connect client
streams); responses are relayed chunk by chunk without decoding (gzip stays gzip).

If the guest closes or resets the connection before it answers (a server that died, or closed
in the middle of an upload), the client gets E2B's 502 body; if it breaks after the response
started — typically because the sandbox was killed — the client connection is cut
(``edge.protocol.abort``), never ended as if whole, which the SDKs turn into "the sandbox was
killed or reached its end of life". Neither is a 500 or a traceback in the node's log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.types import Receive, Scope, Send

from aenv.core.errors import Unavailable
from aenv.core.net import NetSlot
from aenv.edge.protocol import abort
from aenv.orchestrator.deps import GuestConnector
from aenv.proxy.errors import port_not_open, upstream_broken

_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"proxy-connection",
}
#: Largest piece read from the guest at once (and so the largest body message sent on).
READ_SIZE = 65_536
_NO_BODY_STATUS = (204, 304)
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
#: After the guest stopped reading a request body, how long its answer (if it gave one
#: before closing) may take to show up in the reader: it is there already, or never.
EARLY_ANSWER_S = 1.0
log = logging.getLogger("aenv.proxy.forward")


class ClientDisconnected(Exception):
    """The downstream client went away while we were still reading its request body."""


class UpstreamBroken(ConnectionError):
    """The guest closed or broke the connection mid-exchange (an ``OSError``)."""


def _request_head(scope: Scope) -> tuple[bytes, bool, bool]:
    """The request line and headers; whether a body follows and whether it is chunked."""
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    if query:
        path += b"?" + query
    lines = [scope["method"].encode() + b" " + path + b" HTTP/1.1"]
    has_body = chunked = False
    for key, value in scope["headers"]:
        name = key.lower()
        if name == b"content-length":
            has_body = value.strip() != b"0"
        elif name == b"transfer-encoding":
            has_body = chunked = True
        if name not in _HOP_BY_HOP:
            # ASGI gives names lower-cased; a server in the sandbox sees them as E2B's proxy
            # (Go's) sends them, canonical (``X-Api-Key``): some print or match them as sent.
            lines.append(key.title() + b": " + value)
    if chunked:
        lines.append(b"Transfer-Encoding: chunked")
    lines.append(b"\r\n")
    return b"\r\n".join(lines), has_body, chunked


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _send_body(receive: Receive, writer: asyncio.StreamWriter, chunked: bool) -> None:
    async for chunk in _body(receive):
        writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
        await writer.drain()
    if chunked:
        writer.write(b"0\r\n\r\n")
    await writer.drain()


Head = tuple[int, bool, list[tuple[bytes, bytes]]]


async def _read_head(reader: asyncio.StreamReader) -> Head:
    """Status, whether the guest keeps the connection, headers (1xx interim answers skipped)."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise UpstreamBroken("the guest closed the connection before answering") from exc
        except asyncio.LimitOverrunError as exc:
            raise UpstreamBroken("the guest's response head is too large") from exc
        lines = head[:-4].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not rest[:3].isdigit() or not 100 <= int(rest[:3]) <= 599:
            raise UpstreamBroken(f"the guest's status line is not HTTP: {lines[0][:80]!r}")
        status = int(rest[:3])
        if 100 <= status < 200 and status != 101:
            continue
        headers = []
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            headers.append((key.strip().lower(), value.strip()))
        return status, version == b"HTTP/1.1", headers


async def _exchange(receive: Receive, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    head: bytes, has_body: bool, chunked: bool) -> tuple[Head, bool]:
    """Send the request, read the answer's head; and whether the guest answered before it
    had read the whole body. Raises ``UpstreamBroken``/``ConnectionError`` if it never
    answers."""
    writer.write(head)
    if has_body:
        try:
            await _send_body(receive, writer, chunked)
        except ConnectionError as exc:
            # The guest stopped reading: it may have answered already (a 413 of its own),
            # which is in the reader if so.
            try:
                async with asyncio.timeout(EARLY_ANSWER_S):
                    return await _read_head(reader), True
            except (TimeoutError, UpstreamBroken, ConnectionError):
                raise UpstreamBroken("the guest closed the connection during the request "
                                     f"body ({type(exc).__name__})") from exc
    return await _read_head(reader), False


def _response_headers(
    headers: list[tuple[bytes, bytes]],
) -> tuple[int | None, bool, list[tuple[bytes, bytes]], bool]:
    """Content-Length (None: none), whether chunked, the headers to pass on, and whether the
    guest closes the connection after this answer. A malformed length is ``UpstreamBroken``."""
    length: int | None = None
    body_chunked = close = False
    out = []
    for key, value in headers:
        if key == b"content-length":
            if not value.isdigit():
                raise UpstreamBroken(f"the guest sent Content-Length {value[:40]!r}")
            length = int(value)
        elif key == b"transfer-encoding":
            body_chunked = b"chunked" in value.lower()
        elif key == b"connection" and b"close" in value.lower():
            close = True
        if key not in _HOP_BY_HOP:
            out.append((key, value))
    return length, body_chunked, out, close


async def _relay_body(reader: asyncio.StreamReader, send: Send, length: int | None,
                      chunked: bool) -> bool:
    """Stream the response body on; True if the connection may be reused afterwards."""
    try:
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers: dropped
                        pass
                    break
                while size > 0:
                    piece = await reader.readexactly(min(size, READ_SIZE))
                    size -= len(piece)
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
                await reader.readexactly(2)
        elif length is not None:
            while length > 0:
                piece = await reader.read(min(length, READ_SIZE))
                if not piece:
                    raise UpstreamBroken("the guest closed the connection mid-body")
                length -= len(piece)
                # The last piece ends the response: one message less for small answers.
                await send({"type": "http.response.body", "body": piece,
                            "more_body": length > 0})
                if length == 0:
                    return True
        else:  # delimited by the guest closing the connection
            while piece := await reader.read(READ_SIZE):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return False
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise UpstreamBroken(f"the guest's response body is broken: {exc!r}") from exc
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


async def forward(
    scope: Scope, receive: Receive, send: Send, *, guests: GuestConnector, slot: NetSlot,
    sandbox_id: str, port: int,
) -> None:
    head, has_body, chunked = _request_head(scope)
    for attempt in (0, 1):
        try:
            conn = await guests.acquire(slot, port)
        except Unavailable:
            await port_not_open(sandbox_id, port)(scope, receive, send)
            return
        reusable = False
        try:
            try:
                early = await _exchange(receive, conn.reader, conn.writer, head, has_body,
                                        chunked)
                status, keep_alive, headers = early[0]
                length, body_chunked, out, close = _response_headers(headers)
                keep_alive = keep_alive and not close
            except (UpstreamBroken, ConnectionError) as exc:
                # A kept-alive connection the guest closed just now: an idempotent request
                # without a body is safe to send again on a new one (nothing was answered).
                if (conn.reused and not has_body and attempt == 0
                        and scope["method"] in _IDEMPOTENT):
                    continue
                # Nothing was answered yet: E2B's 502, not a 500 and a traceback.
                log.info("sandbox %s port %d: %s", sandbox_id, port, exc)
                await upstream_broken(sandbox_id, port, close=has_body)(scope, receive, send)
                return
            if early[1]:
                # The guest answered before it had read the whole body and closed: the
                # client's connection has the rest of the body in it and cannot be reused.
                keep_alive = False
                out.append((b"connection", b"close"))
            await send({"type": "http.response.start", "status": status, "headers": out})
            if scope["method"] == "HEAD" or status in _NO_BODY_STATUS:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                reusable = keep_alive
                return
            try:
                reusable = await _relay_body(conn.reader, send, None if body_chunked else length,
                                             body_chunked) and keep_alive
            except ConnectionError as exc:
                # The response has started: the client's stream is cut, never ended as if
                # whole, and without a traceback (an ordinary thing for a guest to do).
                log.info("sandbox %s port %d broke its answer: %s", sandbox_id, port, exc)
                abort(scope)
            return
        finally:
            guests.release(conn, reusable=reusable)
