"""The request id at the edge (``core/request_id.py``): a caller's ``X-Request-Id`` kept (or
one made), set for everything the request does, put into the request's own headers (so a
gateway forwards it to the node) and into the answer's."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aenv.core import request_id

_HEADER = request_id.HEADER.encode()


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        others = [(k, v) for k, v in scope.get("headers") or () if k.lower() != _HEADER]
        given = next((v for k, v in scope.get("headers") or () if k.lower() == _HEADER), None)
        rid = request_id.accepted(given.decode("latin-1") if given is not None else None)
        scope = {**scope, "headers": [*others, (_HEADER, rid.encode())]}

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers") or () if k.lower() != _HEADER]
                message = {**message, "headers": [*kept, (_HEADER, rid.encode())]}
            await send(message)

        token = request_id.current.set(rid)
        try:
            await self.app(scope, receive, stamped)
        finally:
            request_id.current.reset(token)
