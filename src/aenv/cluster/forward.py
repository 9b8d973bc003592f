"""Passing one request through to a node and its answer back, streamed both ways.

Bodies are streamed, not buffered (file uploads, Connect server streams of a command's
output), and the answer's bytes go back as the node sent them (``aiter_raw``: no
decompression). Hop-by-hop headers are dropped both ways (RFC 9110 §7.6.1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

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


async def forward(http: httpx.AsyncClient, request: Request, base_url: str,
                  body: bytes | None = None) -> Response:
    """``request`` sent to ``base_url`` (same path and query); raises ``httpx.TransportError``
    if the node cannot be reached (nothing was answered yet)."""
    url = base_url.rstrip("/") + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    upstream = http.build_request(
        request.method, url, headers=request_headers(request),
        content=body if body is not None else _body(request))
    answer = await http.send(upstream, stream=True)
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
    return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                             headers=headers, background=BackgroundTask(answer.aclose))
