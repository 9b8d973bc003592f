"""How the host reaches a port of the guest behind one slot.

Every guest has the same address (169.254.0.21), so the address says nothing about *which*
sandbox a connection goes to: the socket must be bound to the slot's host veth
(``SO_BINDTODEVICE``) before it connects. The kernel then routes it out of that veth whatever
the routing table says, and the nft table (nft.py) keeps its conntrack entry in the slot's zone.
Binding to a device needs CAP_NET_RAW (the node runs as root).

httpx's ``socket_options`` cannot do this: httpcore sets them *after* ``connect()``, when the SYN
has already left through whichever veth the routing table lists first (measured: every request
then reaches the first slot's guest). ``GuestTransport`` therefore gives httpx a network
backend that binds each socket before connecting.

``GuestConnector`` implements the orchestrator's ``GuestConnector`` protocol: one cached httpx
transport per slot (keep-alive connections survive between requests), raw sockets for the
proxy's WebSocket relay, and the pool of raw keep-alive connections the proxy's HTTP relay
uses (guest_pool.py); ``forget`` closes all three kinds.

Owns: sockets and httpx transports to guests. Must not touch: slots themselves (pool.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

from aenv.core.errors import Unavailable
from aenv.core.net import NetSlot

if TYPE_CHECKING:
    from aenv.network.guest_pool import PooledConnection

#: A guest answers a SYN within a millisecond or refuses it at once (netstack sends RST);
#: seconds of silence mean the sandbox is frozen or gone.
CONNECT_TIMEOUT_S = 5.0
#: Polling interval of ``wait_http``: a boot takes ~100s of ms, so 5 ms costs little.
POLL_INTERVAL_S = 0.005

#: Keep-alive connections per guest: envd and a user port or two; a proxy fans out more.
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class _Gate:
    """Connections being opened to one slot's guest, and whether new ones may start."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.connecting = 0
        self.idle = asyncio.Event()
        self.idle.set()


#: host veth name → its gate, while a connect or a hold is under way.
_GATES: dict[str, _Gate] = {}


@contextlib.asynccontextmanager
async def connections_held(slot: NetSlot, *, timeout: float = CONNECT_TIMEOUT_S
                           ) -> AsyncIterator[None]:
    """While inside: no new connection to the guest behind ``slot`` starts (``open_socket``
    waits at the gate), and on entry every connect already under way has finished its
    handshake. A connect cut off mid-handshake leaves the guest a half-open endpoint that
    this runsc cannot checkpoint (nil dereference saving a SYN-RECV endpoint)."""
    gate = _GATES.setdefault(slot.host_ifname, _Gate())
    gate.open.clear()
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await gate.idle.wait()
        yield
    finally:
        gate.open.set()
        if gate.connecting == 0 and _GATES.get(slot.host_ifname) is gate:
            del _GATES[slot.host_ifname]


def accepting(slot: NetSlot) -> bool:
    """False while the slot is held (a checkpoint): connections must not be used then."""
    gate = _GATES.get(slot.host_ifname)
    return gate is None or gate.open.is_set()


def bound_socket(slot: NetSlot) -> socket.socket:
    """A fresh non-blocking TCP socket bound to ``slot``'s host veth, not yet connected."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, slot.host_ifname.encode())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def open_socket(
    slot: NetSlot, port: int, *, timeout: float = CONNECT_TIMEOUT_S
) -> socket.socket:
    """A connected, non-blocking TCP socket to ``guest:port`` behind ``slot``.

    Prerequisites: the slot exists; root (SO_BINDTODEVICE).
    On success: the caller owns the socket and closes it.
    On failure: raises ``Unavailable`` (refused, timed out, veth gone); no socket leaks.
    """
    try:
        sock = bound_socket(slot)
    except OSError as exc:  # the veth is gone (ENODEV): the slot was released
        raise Unavailable(f"the sandbox on {slot.host_ifname} is unreachable: {exc!r}") from exc
    gate = _GATES.setdefault(slot.host_ifname, _Gate())
    try:
        async with asyncio.timeout(timeout):
            await gate.open.wait()  # a checkpoint is being taken: start afterwards
            gate.connecting += 1
            gate.idle.clear()
            try:
                await asyncio.get_running_loop().sock_connect(sock, (slot.guest_ip, port))
            finally:
                gate.connecting -= 1
                if gate.connecting == 0:
                    gate.idle.set()
                    if gate.open.is_set() and _GATES.get(slot.host_ifname) is gate:
                        del _GATES[slot.host_ifname]
    except BaseException as exc:
        sock.close()
        if isinstance(exc, (OSError, TimeoutError)):
            raise Unavailable(
                f"cannot connect to port {port} of the sandbox on {slot.host_ifname}: {exc!r}"
            ) from exc
        raise
    return sock


async def open_connection(
    slot: NetSlot, port: int, *, timeout: float = CONNECT_TIMEOUT_S
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Like ``open_socket``, as asyncio streams."""
    sock = await open_socket(slot, port, timeout=timeout)
    try:
        return await asyncio.open_connection(sock=sock)
    except BaseException:
        sock.close()
        raise


class _GuestStream(httpcore.AsyncNetworkStream):
    """httpcore's view of one connected guest socket (asyncio, plain TCP)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.get_running_loop().sock_recv(self._sock, max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().sock_sendall(self._sock, buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._sock.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("guests are reached over plain HTTP")

    def get_extra_info(self, info: str) -> Any:
        # "socket" lets httpcore notice a keep-alive connection the guest has closed.
        if info == "socket":
            return self._sock
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        return None


class _GuestBackend(httpcore.AsyncNetworkBackend):
    """Connects only to the guest behind one slot, binding to its veth before ``connect``."""

    def __init__(self, slot: NetSlot, connect_timeout: float) -> None:
        self._slot = slot
        self._connect_timeout = connect_timeout

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if host != self._slot.guest_ip:
            raise httpcore.ConnectError(f"this transport only reaches {self._slot.guest_ip}")
        try:
            sock = await open_socket(self._slot, port, timeout=timeout or self._connect_timeout)
        except Unavailable as exc:
            if isinstance(exc.__cause__, TimeoutError):
                raise httpcore.ConnectTimeout(exc.message) from exc
            raise httpcore.ConnectError(exc.message) from exc
        return _GuestStream(sock)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("guests are reached over TCP")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class GuestTransport(httpx.AsyncHTTPTransport):
    """An httpx transport to the guest behind ``slot``.

    Use with ``base_url=f"http://{slot.guest_ip}:{port}"``; requests to any other host fail
    with ``httpx.ConnectError``.
    """

    def __init__(
        self,
        slot: NetSlot,
        *,
        limits: httpx.Limits = DEFAULT_LIMITS,
        retries: int = 0,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        # Guests speak plain HTTP; sharing one TLS context spares building one (tens of ms of
        # CPU) for every transport.
        super().__init__(limits=limits, retries=retries, verify=_tls_context())
        # httpx offers no way to pass a network backend, so the pool it built is replaced by
        # an identical one that connects through ours (httpx only calls ``self._pool``).
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            retries=retries,
            network_backend=_GuestBackend(slot, connect_timeout),
        )


def transport(slot: NetSlot, **kwargs: Any) -> GuestTransport:
    """A new httpx transport to the guest behind ``slot`` (see ``GuestTransport``)."""
    return GuestTransport(slot, **kwargs)


async def wait_http(
    slot: NetSlot,
    port: int,
    path: str = "/health",
    *,
    timeout: float,
    expect: int = 204,
) -> float:
    """Poll ``GET path`` on the guest until it answers ``expect``; seconds it took.

    On failure: raises ``Unavailable`` after ``timeout`` seconds, naming the last error.
    """
    started = time.monotonic()
    last: str = "no attempt"
    async with httpx.AsyncClient(
        transport=transport(slot), base_url=f"http://{slot.guest_ip}:{port}", timeout=1.0
    ) as client:
        while time.monotonic() - started < timeout:
            try:
                response = await client.get(path)
                if response.status_code == expect:
                    return time.monotonic() - started
                last = f"status {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            await asyncio.sleep(POLL_INTERVAL_S)
    raise Unavailable(f"{path} on port {port} behind {slot.host_ifname} did not answer: {last}")


class _SharedTransport(httpx.AsyncBaseTransport):
    """A cached transport that users may "close" (httpx clients close their transport on
    exit) without dropping the keep-alive connections other users share."""

    def __init__(self, inner: httpx.AsyncHTTPTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Kept open: ``GuestConnector.forget`` closes it when the slot goes away."""

    async def close_for_real(self) -> None:
        await self._inner.aclose()


class GuestConnector:
    """Connections to guests, per slot (the orchestrator's ``GuestConnector``)."""

    def __init__(self, *, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        from aenv.network.guest_pool import GuestPool  # guest_pool builds on this module

        self._connect_timeout = connect_timeout
        self._transports: dict[tuple[int, str], _SharedTransport] = {}
        self._pool = GuestPool(connect_timeout=connect_timeout)

    async def acquire(self, slot: NetSlot, port: int) -> PooledConnection:
        """A keep-alive connection to ``guest:port`` behind ``slot`` (see guest_pool.py)."""
        return await self._pool.acquire(slot, port)

    def release(self, conn: PooledConnection, *, reusable: bool) -> None:
        self._pool.release(conn, reusable=reusable)

    def pooled(self, slot: NetSlot) -> int:
        """Open pooled connections to the guest behind ``slot`` (idle or in use)."""
        return self._pool.count(slot)

    def transport(self, slot: NetSlot) -> httpx.AsyncBaseTransport:
        """The cached transport for ``slot`` (created on first use)."""
        key = (slot.index, slot.host_ifname)
        shared = self._transports.get(key)
        if shared is None:
            inner = GuestTransport(slot, connect_timeout=self._connect_timeout)
            shared = self._transports[key] = _SharedTransport(inner)
        return shared

    async def open_socket(self, slot: NetSlot, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to ``guest:port`` behind ``slot``."""
        return await open_socket(slot, port, timeout=self._connect_timeout)

    def held(self, slot: NetSlot) -> contextlib.AbstractAsyncContextManager[None]:
        """See ``connections_held``."""
        return connections_held(slot, timeout=self._connect_timeout)

    async def forget(self, slot: NetSlot) -> None:
        """Close the cached connections of a slot that is being released. Idempotent."""
        await self._pool.forget(slot)
        shared = self._transports.pop((slot.index, slot.host_ifname), None)
        if shared is not None:
            with contextlib.suppress(Exception):
                await shared.close_for_real()

    async def aclose(self) -> None:
        """Close every cached transport (server shutdown)."""
        await self._pool.aclose()
        for shared in list(self._transports.values()):
            with contextlib.suppress(Exception):
                await shared.close_for_real()
        self._transports.clear()
