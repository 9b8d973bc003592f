"""The HTTP/1.1 connection under the node's ASGI app: uvicorn's httptools protocol, guarded.

What ASGI cannot see happens before a request reaches the app, so it is bounded here
(docs/limits.md):

* **Head size.** httptools keeps a header whole until it ends, with no limit of its own
  (uvicorn's ``h11_max_incomplete_event_size`` is for the h11 parser only): bytes of a head
  still incomplete are counted as they arrive, and a head over ``max_header_bytes`` is answered
  431 and the connection closed. The node holds at most that plus one socket read (256 KiB).
* **Header-read timeout.** A head must be complete within ``header_read_timeout_s`` of the
  connection's accept (or of the first byte of a kept-alive connection's next request); uvicorn
  has no such timer (its ``timeout_keep_alive`` runs only between requests).
* **Slow connections per client.** A connection is *waiting* from its accept (or its next
  request's first byte) until its head is complete. One client address may have
  ``max_slow_per_client`` waiting; past that, a new connection replaces the client's oldest
  waiting one if that one has waited ``SLOW_AFTER_S`` (it is answered 408 and closed), and is
  let through if none has (a burst: many connections opened at once, each about to send its
  head) up to ``BURST_FACTOR`` times the bound, then answered 429. So a slow-loris client holds
  at most the bound of slow connections, and a client that opens hundreds of connections at
  once is not refused for it. uvicorn's ``limit_concurrency`` is one count for the whole
  server, which such a client fills for everyone.
* **Aborting a response.** ``scope["extensions"]["aenv.abort"]`` closes the connection under
  a response that cannot be finished (the guest or a node broke mid-body) without uvicorn
  logging it as an application error: the client sees the stream cut, never a false end.

Every answer given here is an E2B error body (``{"code", "message"}``), uvicorn's own 400 for a
malformed request included.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import httptools
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from aenv.core.settings import Settings

log = logging.getLogger("aenv.edge.protocol")

#: The scope extension of :func:`abort`.
ABORT = "aenv.abort"
#: A connection waiting this long for its head is slow: at the bound, its client's next
#: connection replaces it. Younger ones are a burst (a head takes microseconds to send).
SLOW_AFTER_S = 1.0
#: How far past the bound a burst of young connections of one client may go.
BURST_FACTOR = 4


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int = 65_536
    header_read_timeout_s: float = 15.0
    max_slow_per_client: int = 128

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(max_header_bytes=settings.max_header_bytes,
                   header_read_timeout_s=settings.header_read_timeout_s,
                   max_slow_per_client=settings.max_slow_connections_per_client)


def abort(scope: Scope) -> None:
    """End the response of ``scope`` unfinished: close its connection. Under a server without
    the extension, nothing (the app returns and the server ends the connection itself)."""
    close = scope.get("extensions", {}).get(ABORT)
    if close is not None:
        close()


def error_response(status: int, message: str) -> bytes:
    """A whole E2B error response that closes the connection, as raw HTTP/1.1."""
    body = json.dumps({"code": status, "message": message}).encode()
    return b"".join([
        STATUS_LINE[status], b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body), b"connection: close\r\n",
        *([b"retry-after: 1\r\n"] if status == 429 else []), b"\r\n", body])


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class GuardedProtocol(HttpToolsProtocol):
    """Per connection; the class attributes are one server's (see :func:`protocol_class`)."""

    limits: ConnectionLimits = ConnectionLimits()
    #: Waiting connections per client address, oldest first, with when they began to wait;
    #: shared by the server's connections.
    waiting: dict[str, dict[GuardedProtocol, float]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = False
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._rejection: tuple[int, str] | None = None

    # -- waiting for a head -----------------------------------------------------------------

    def _client_key(self) -> str:
        return self.client[0] if self.client else ""

    def _start_waiting(self) -> bool:
        """Count this connection as waiting for a head; False if its client has too many."""
        if self._waiting:
            return True
        key = self._client_key()
        now = self.loop.time()
        mine = self.waiting.get(key, {})
        if len(mine) >= self.limits.max_slow_per_client:
            oldest, since = next(iter(mine.items()))
            if now - since >= SLOW_AFTER_S:
                oldest._reject(408, "replaced by a newer connection of this client, which "
                                    "had too many waiting for their request head")
            elif len(mine) >= BURST_FACTOR * self.limits.max_slow_per_client:
                return False
        self.waiting.setdefault(key, {})[self] = now
        self._waiting = True
        self._head_bytes = 0
        self._head_timer = self.loop.call_later(self.limits.header_read_timeout_s,
                                                self._head_timed_out)
        return True

    def _stop_waiting(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._waiting:
            self._waiting = False
            key = self._client_key()
            mine = self.waiting.get(key, {})
            mine.pop(self, None)
            if not mine:
                self.waiting.pop(key, None)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._waiting or self.transport.is_closing():
            return
        self._stop_waiting()
        if self._head_bytes or self.url:
            self._reject(408, "the request head did not arrive in time")
        else:
            self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.write(error_response(status, message))
            self.transport.close()

    # -- uvicorn's protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.url = b""
        if not self._start_waiting():
            log.debug("refused a connection of %s: too many waiting for their head",
                      self._client_key())
            self._reject(429, "too many connections of this client are waiting for their "
                              "request head")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused or timed out: the rest is not read
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._rejection is None:
                self.logger.warning("Invalid HTTP request received.")
                self._rejection = (400, "invalid HTTP request")
            self._reject(*self._rejection)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._waiting:
            # Still no whole head: all of this read was head (a complete one is measured in
            # on_headers_complete, whatever body came with it).
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._reject(431, f"request head over {self.limits.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        self._reject(400, msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {ABORT: self._abort}  # type: ignore[dict-item]
        if not self._start_waiting():
            self._rejection = (429, "too many connections of this client are waiting for "
                                    "their request head")
            raise _Rejected

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        self._stop_waiting()
        if size > self.limits.max_header_bytes:
            self._rejection = (431, f"request head over {self.limits.max_header_bytes} bytes")
            raise _Rejected
        super().on_headers_complete()

    def _abort(self) -> None:
        # Marked disconnected first: uvicorn then takes the unfinished response as the
        # client's doing and does not log it as the application's error.
        for cycle in (self.cycle, *(c for c, _ in self.pipeline)):
            if cycle is not None:
                cycle.disconnected = True
        self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for one server (uvicorn's ``http=``), with its own waiting count."""
    return type("NodeHttpProtocol", (GuardedProtocol,), {"limits": limits, "waiting": {}})
