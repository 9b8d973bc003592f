"""Glue between envd's services and connectrpc: error mapping and per-request identity."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from aenv.core.errors import AenvError
from aenv.envd.state import EnvdState
from aenv.envd.users import User, lookup_user, username_from_authorization

log = logging.getLogger("aenv.envd")

#: The request context every handler receives (message types vary per method).
Ctx = RequestContext[Any, Any]

_CODES: dict[str, Code] = {code.value: code for code in Code}


def to_connect_error(exc: BaseException) -> ConnectError:
    """The one conversion from a domain (or unexpected) error to a Connect error."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, AenvError):
        return ConnectError(_CODES[exc.connect_code], exc.message)
    if isinstance(exc, PermissionError):
        return ConnectError(Code.PERMISSION_DENIED, str(exc))
    if isinstance(exc, FileNotFoundError):
        return ConnectError(Code.NOT_FOUND, str(exc))
    log.exception("unexpected error in RPC", exc_info=exc)
    return ConnectError(Code.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


class ErrorMappingInterceptor:
    """Renders every exception a handler raises as a proper Connect error, never a traceback."""

    async def intercept_unary(
        self, call_next: Callable[[Any, Ctx], Awaitable[Any]], request: Any,
        ctx: Ctx, /,
    ) -> Any:
        try:
            return await call_next(request, ctx)
        except Exception as exc:
            raise to_connect_error(exc) from exc

    async def intercept_client_stream(
        self, call_next: Callable[[AsyncIterator[Any], Ctx], Awaitable[Any]],
        request: AsyncIterator[Any], ctx: Ctx, /,
    ) -> Any:
        try:
            return await call_next(request, ctx)
        except Exception as exc:
            raise to_connect_error(exc) from exc

    async def intercept_server_stream(
        self, call_next: Callable[[Any, Ctx], AsyncIterator[Any]], request: Any,
        ctx: Ctx, /,
    ) -> AsyncIterator[Any]:
        try:
            async for message in call_next(request, ctx):
                yield message
        except Exception as exc:
            raise to_connect_error(exc) from exc


class StrictJSONCodec:
    """The JSON codec, but a body that does not parse is the client's fault (invalid_argument),
    not an ``unknown`` error with HTTP 500 as connectrpc reports it by default."""

    def __init__(self) -> None:
        self._inner: Codec[Any, Any] = proto_json_codec()

    def name(self) -> str:
        return self._inner.name()

    def encode(self, message: Any) -> bytes:
        return self._inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> Any:
        try:
            return self._inner.decode(data, message_class)
        except Exception as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"malformed request message: {exc}") from exc


def codecs() -> list[Codec[Any, Any]]:
    return [StrictJSONCodec(), proto_binary_codec()]


def request_user(ctx: Ctx, state: EnvdState) -> User:
    """The OS user an RPC acts as (Basic header, else the sandbox's default user)."""
    name = username_from_authorization(ctx.request_headers.get("authorization"))
    return lookup_user(name or state.default_user)


#: envd's default when the client sends no (or a bad) ``Keepalive-Ping-Interval``.
DEFAULT_KEEPALIVE_S = 90.0


def keepalive_interval(ctx: Ctx) -> float:
    raw = ctx.request_headers.get("keepalive-ping-interval")
    try:
        value = float(raw) if raw else DEFAULT_KEEPALIVE_S
    except ValueError:
        return DEFAULT_KEEPALIVE_S
    return value if value > 0 else DEFAULT_KEEPALIVE_S
