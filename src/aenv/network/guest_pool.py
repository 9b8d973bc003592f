"""Keep-alive TCP connections to guest ports, per slot, for the proxy's raw HTTP/1.1 relay.

The proxy used to send every request through an httpx client: per request that built a
``Request``, a ``Response``, cookie jars, header objects and ran httpcore's pool bookkeeping
(over half of the node's CPU per proxied request, measured with py-spy). This pool hands out
bare asyncio streams instead; the proxy writes and parses HTTP/1.1 itself (proxy/forward.py).

The checkpoint contract (orchestrator/ops/quiesce.py) holds here too: while a slot is held
(``guest_http.connections_held``) no idle connection is handed out (``acquire`` waits at the
same gate a new connect does), and ``forget`` closes every connection of the slot, idle or in
use, so nothing of the host stays connected to the guest when its memory is saved.

Owns: the pooled connections. Must not touch: slots themselves (pool.py), the gate (guest_http).
"""

from __future__ import annotations

import asyncio
import contextlib

from aenv.core.net import NetSlot
from aenv.network import guest_http

#: Idle connections kept per guest port: wrk-like fan-in of 16-64 clients stays warm.
MAX_IDLE_PER_PORT = 64

#: How long ``forget`` waits for closed connections to flush (a frozen guest takes nothing).
CLOSE_WAIT_S = 0.5

_Key = tuple[int, str]


class PooledConnection:
    """One connection to ``guest:port`` behind a slot; ``reused`` once it served a request."""

    __slots__ = ("key", "port", "reader", "reused", "writer")

    def __init__(self, key: _Key, port: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.port = port
        self.reader = reader
        self.writer = writer
        self.reused = False

    def usable(self) -> bool:
        """Still open both ways (the guest did not close it while it was idle)."""
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            transport = self.writer.transport
            # Unsent bytes to a frozen guest would keep the socket open until they are taken.
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()


class GuestPool:
    """Idle connections per (slot, port); every connection of a slot is tracked until closed."""

    def __init__(self, *, connect_timeout: float = guest_http.CONNECT_TIMEOUT_S) -> None:
        self._connect_timeout = connect_timeout
        self._idle: dict[tuple[_Key, int], list[PooledConnection]] = {}
        self._all: dict[_Key, set[PooledConnection]] = {}

    async def acquire(self, slot: NetSlot, port: int) -> PooledConnection:
        """An idle connection to ``guest:port`` behind ``slot``, else a new one.

        On success: the caller owns the connection until ``release``.
        On failure: raises ``Unavailable`` (refused, timed out, veth gone).
        """
        key = (slot.index, slot.host_ifname)
        idle = self._idle.get((key, port))
        if idle and guest_http.accepting(slot):
            while idle:
                conn = idle.pop()
                if conn.usable():
                    conn.reused = True
                    return conn
                self._drop(conn)
        reader, writer = await guest_http.open_connection(slot, port,
                                                          timeout=self._connect_timeout)
        conn = PooledConnection(key, port, reader, writer)
        self._all.setdefault(key, set()).add(conn)
        return conn

    def release(self, conn: PooledConnection, *, reusable: bool) -> None:
        """Give a connection back: kept if ``reusable`` (a complete keep-alive exchange) and
        its slot was not forgotten meanwhile, else closed."""
        if (reusable and conn in self._all.get(conn.key, ()) and conn.usable()):
            idle = self._idle.setdefault((conn.key, conn.port), [])
            if len(idle) < MAX_IDLE_PER_PORT:
                idle.append(conn)
                return
        self._drop(conn)

    def _drop(self, conn: PooledConnection) -> None:
        conns = self._all.get(conn.key)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self._all[conn.key]
        conn.close()

    def count(self, slot: NetSlot) -> int:
        """Open connections (idle or in use) to the guest behind ``slot``."""
        return len(self._all.get((slot.index, slot.host_ifname), ()))

    async def forget(self, slot: NetSlot) -> None:
        """Close every connection of ``slot``, in use or idle. Idempotent."""
        key = (slot.index, slot.host_ifname)
        for idle_key in [k for k in self._idle if k[0] == key]:
            del self._idle[idle_key]
        conns = self._all.pop(key, set())
        for conn in conns:
            conn.close()
        # Let the transports send their FINs before the caller goes on (a checkpoint); a
        # frozen guest may never take unsent bytes, so do not wait for them for long.
        if conns:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await asyncio.gather(*(c.writer.wait_closed() for c in conns),
                                         return_exceptions=True)

    async def aclose(self) -> None:
        """Close every connection (server shutdown)."""
        for conns in self._all.values():
            for conn in conns:
                conn.close()
        self._all.clear()
        self._idle.clear()
