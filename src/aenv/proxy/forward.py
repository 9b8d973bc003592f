"""Forward one HTTP request to a guest port and stream the answer back, both ways unbuffered.

Request bodies are passed on as they arrive (chunked uploads, Connect client streams); responses
are relayed chunk by chunk without decoding (gzip stays gzip). If the upstream breaks after the
response started — typically because the sandbox was killed — the client connection is dropped,
which the SDKs turn into "the sandbox was killed or reached its end of life".
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from starlette.types import Receive, Scope, Send

from aenv.proxy.errors import port_not_open

_HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"proxy-connection",
}

#: Streams (command output, watches) may be silent for a long time: no read timeout. Connecting
#: to a port nobody listens on fails at once with a refusal; the timeout covers a hung guest.
UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=None, pool=10.0)


class ClientDisconnected(Exception):
    """The downstream client went away while we were still reading its request body."""


def _request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]


def _has_body(scope: Scope) -> bool:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return bool(value.strip() != b"0")
        if key == b"transfer-encoding":
            return True
    return False


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


async def forward(
    scope: Scope, receive: Receive, send: Send, *, client: httpx.AsyncClient,
    sandbox_id: str, host: str, port: int,
) -> None:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    url = httpx.URL(
        scheme="http", host=host, port=port,
        raw_path=path + (b"?" + query if query else b""),
    )
    request = client.build_request(
        scope["method"], url, headers=_request_headers(scope),
        content=_body(receive) if _has_body(scope) else None,
    )
    try:
        response = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout):
        await port_not_open(sandbox_id, port)(scope, receive, send)
        return
    try:
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": headers})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()
