"""WebSocket upgrade to a guest port: accept downstream, connect upstream, relay both ways."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

_SKIP = {b"host", b"upgrade", b"connection", b"sec-websocket-key", b"sec-websocket-version",
         b"sec-websocket-extensions", b"sec-websocket-protocol", b"content-length"}


async def relay(
    scope: Scope, receive: Receive, send: Send, *, sock: socket.socket, host: str, port: int
) -> None:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    uri = f"ws://{host}:{port}{path.decode('latin-1')}" + (f"?{query.decode()}" if query else "")
    headers = [(k.decode("latin-1"), v.decode("latin-1"))
               for k, v in scope["headers"] if k.lower() not in _SKIP]
    subprotocols = scope.get("subprotocols") or None
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    try:
        upstream = await ws_connect(
            uri, sock=sock, additional_headers=headers, subprotocols=subprotocols,
            open_timeout=10, max_size=None, compression=None,
        )
    except (OSError, InvalidHandshake, InvalidStatus, TimeoutError):
        await send({"type": "websocket.close", "code": 1011})
        return
    async with upstream:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

        async def downstream_to_upstream() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "websocket.disconnect":
                    await upstream.close(msg.get("code", 1000))
                    return
                if msg.get("bytes") is not None:
                    await upstream.send(msg["bytes"])
                elif msg.get("text") is not None:
                    await upstream.send(msg["text"])

        async def upstream_to_downstream() -> None:
            try:
                async for data in upstream:
                    if isinstance(data, bytes):
                        await send({"type": "websocket.send", "bytes": data})
                    else:
                        await send({"type": "websocket.send", "text": data})
            except ConnectionClosed:
                pass
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": upstream.close_code or 1000})

        tasks = [asyncio.create_task(downstream_to_upstream()),
                 asyncio.create_task(upstream_to_downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
