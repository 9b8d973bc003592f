"""Request limits at the ASGI edge of the node (and of the cluster's gateway): body sizes,
a request body that stops arriving, and the size of a create's metadata and env vars.

A body over its limit is refused from its ``Content-Length`` before a byte of it is read, and
a chunked one as soon as it passes the limit; either way the answer (413, E2B's body) closes
the connection, so the rest is never read. What each limit is and why: docs/limits.md. Head
size, header-read timeouts and slow connections are below ASGI, in ``edge/protocol.py``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from aenv.core.errors import InvalidArgument
from aenv.core.settings import Settings
from aenv.edge.errors import error_body
from aenv.edge.protocol import abort

#: ``PUT`` of a build-file upload or of a volume file: streamed to disk by its route, within
#: ``max_upload_bytes`` (a volume's own size bounds the second too).
_UPLOAD = re.compile(r"^(/templates/[^/]+/files/[^/]+/upload|/volumecontent/[^/]+/file)$")


@dataclass(frozen=True)
class BodyLimits:
    """Largest request bodies in bytes (0: unbounded) and the API's body idle timeout."""

    api: int = 4 << 20
    proxy: int = 0
    upload: int = 10 << 30
    idle_s: float | None = 60.0

    @classmethod
    def of(cls, settings: Settings) -> BodyLimits:
        return cls(api=settings.max_body_bytes, proxy=settings.proxy_max_body_bytes,
                   upload=settings.max_upload_bytes, idle_s=settings.body_idle_timeout_s)

    def for_api(self, scope: Scope) -> int:
        return self.upload if is_upload(scope) else self.api


def is_upload(scope: Scope) -> bool:
    """A build-file upload (``PUT`` to its signed URL) or a volume file's write."""
    return scope["method"] == "PUT" and _UPLOAD.match(scope["path"]) is not None


class BodyTooLarge(HTTPException):
    """Raised by the limited ``receive``; an ``HTTPException`` so that FastAPI, reading the
    body for a route, passes it on to the one error handler instead of making it a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit} bytes")


class BodyTimedOut(HTTPException):
    def __init__(self, idle_s: float) -> None:
        super().__init__(408, f"the request body stopped arriving for {idle_s:g} s")


def _declared(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def guard(call: Callable[[Receive, Send], Awaitable[None]], scope: Scope,
                receive: Receive, send: Send, *, limit: int, idle_s: float | None) -> None:
    """Run ``call`` for the HTTP request ``scope`` with its body held to ``limit`` bytes and
    ``idle_s`` seconds between pieces (None: no timeout)."""
    declared = _declared(scope)
    if limit and declared is not None and declared > limit:
        await _refuse(BodyTooLarge(limit), scope, receive, send)
        return
    # httptools stops a body at its Content-Length: only a chunked one needs counting.
    count = bool(limit) and declared is None
    if not count and idle_s is None:
        await call(receive, send)
        return
    seen = 0
    done = False
    cut = False
    started = False

    async def limited() -> Message:
        nonlocal seen, done, cut
        if done:
            return await receive()
        try:
            if idle_s is None:
                message = await receive()
            else:
                async with asyncio.timeout(idle_s):
                    message = await receive()
        except TimeoutError:
            cut = True
            raise BodyTimedOut(idle_s) from None  # type: ignore[arg-type]
        if message["type"] != "http.request":
            return message
        done = not message.get("more_body", False)
        seen += len(message.get("body", b""))
        if count and seen > limit:
            cut = True
            raise BodyTooLarge(limit)
        return message

    async def tracked(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
            if cut:  # the rest of the body is not read: the connection cannot be reused
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"connection", b"close")]}
        await send(message)

    try:
        await call(limited, tracked)
    except (BodyTooLarge, BodyTimedOut) as exc:
        if started:
            abort(scope)
        else:
            await _refuse(exc, scope, receive, send)


async def _refuse(exc: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    response = error_body(exc.status_code, str(exc.detail), {"connection": "close"})
    await response(scope, receive, send)


def check_sandbox_inputs(settings: Settings, metadata: Mapping[str, str] | None,
                         env_vars: Mapping[str, str] | None) -> None:
    """Raise ``InvalidArgument`` (400) for a create's metadata or env vars past the limits."""
    _check("metadata", metadata or {}, keys=settings.max_metadata_keys,
           key_bytes=settings.max_metadata_key_bytes,
           value_bytes=settings.max_metadata_value_bytes, total=settings.max_metadata_bytes)
    _check("envVars", env_vars or {}, keys=settings.max_env_vars,
           key_bytes=settings.max_env_var_name_bytes,
           value_bytes=settings.max_env_var_value_bytes, total=settings.max_env_vars_bytes)


def _check(what: str, items: Mapping[str, str], *, keys: int, key_bytes: int,
           value_bytes: int, total: int) -> None:
    if len(items) > keys:
        raise InvalidArgument(f"{what}: {len(items)} keys, over the limit of {keys}")
    size = 0
    for key, value in items.items():
        # surrogatepass: JSON may carry lone surrogates, which strict UTF-8 cannot encode.
        k = len(key.encode(errors="surrogatepass"))
        v = len(value.encode(errors="surrogatepass"))
        if k > key_bytes:
            raise InvalidArgument(f"{what}: key {key[:40]!r}... is {k} bytes, over the limit "
                                  f"of {key_bytes}")
        if v > value_bytes:
            raise InvalidArgument(f"{what}: the value of {key[:40]!r} is {v} bytes, over the "
                                  f"limit of {value_bytes}")
        size += k + v
    if size > total:
        raise InvalidArgument(f"{what}: {size} bytes in all, over the limit of {total}")
