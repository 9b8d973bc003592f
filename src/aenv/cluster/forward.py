"""Passing one request through to a node and its answer back, streamed both ways.

Bodies are streamed, not buffered (file uploads, Connect server streams of a command's
output), and the answer's bytes go back as the node sent them (``aiter_raw``: no
decompression). Hop-by-hop headers are dropped both ways (RFC 9110 §7.6.1).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from aenv.edge.protocol import abort

log = logging.getLogger("aenv.cluster.forward")

#: Connecting to a node: a node that does not accept within this is unreachable.
CONNECT_TIMEOUT_S = 5.0
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "te", "trailer", "transfer-encoding", "upgrade", "host"})


def client() -> httpx.AsyncClient:
    # No read timeout: a command's output stream may be quiet for as long as it runs.
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                             limits=httpx.Limits(max_connections=1000,
                                                 max_keepalive_connections=100))


def request_headers(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


async def send(http: httpx.AsyncClient, request: Request, base_url: str,
               body: bytes | None = None) -> httpx.Response:
    """``request`` sent to ``base_url`` (same path and query), its answer not yet read (pass
    it to :func:`relay`, or ``aclose`` it); raises ``httpx.TransportError`` if the node cannot
    be reached (nothing was answered yet)."""
    url = base_url.rstrip("/") + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    upstream = http.build_request(
        request.method, url, headers=request_headers(request),
        content=body if body is not None else _body(request))
    return await http.send(upstream, stream=True)


class _Relayed(StreamingResponse):
    """A node's answer streamed back. If the node drops the connection mid-body (a command
    stream of a sandbox that was killed), the client's answer ends the same way, unfinished:
    finishing it would hand the client a truncated body as if it were whole."""

    scope: Scope | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError as exc:
            log.info("a node ended an answer mid-body: %s", type(exc).__name__)
            if self.scope is not None:
                abort(self.scope)  # the connection is cut, not logged as our error
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def relay(answer: httpx.Response) -> Response:
    """The node's answer, streamed back as it comes."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
    return _Relayed(answer.aiter_raw(), status_code=answer.status_code, headers=headers,
                    background=BackgroundTask(answer.aclose))


async def forward(http: httpx.AsyncClient, request: Request, base_url: str,
                  body: bytes | None = None) -> Response:
    """:func:`send`, then :func:`relay`."""
    return relay(await send(http, request, base_url, body))
