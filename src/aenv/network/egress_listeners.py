"""One slot's listener set of the egress proxy (``egress_proxy.py``): its TCP listeners and
its DNS socket, bound to the slot's own veth, and their closing.

Made in two steps, so the proxy can register the set between them: ``bind`` (synchronous:
the ports are taken, or nothing is) and ``serve`` (the loop's servers on those sockets). A
``close`` while ``serve`` runs (the slot released during its update) is left to ``serve``,
which closes what it made and makes nothing more.

Owns: the sockets, servers and transport of one slot. Must not touch: nft, other slots.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aenv.core.errors import Unavailable
from aenv.core.net import EgressPolicy, NetSlot

Accept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def bound(ifname: str, kind: int, port: int, *, transparent: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_INET, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if transparent:  # TPROXY's: it accepts connections to any address (nft.py)
            sock.setsockopt(socket.SOL_IP, socket.IP_TRANSPARENT, 1)
        # Bound to the slot's veth: replies go out through it (every guest has one address),
        # and one port serves every slot, a listener each.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        sock.bind(("0.0.0.0", port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class SlotListeners:
    slot: NetSlot
    #: Read per connection and per query: an update applies to the next one.
    policy: EgressPolicy
    #: The servers' and transport's close, then the bound sockets (closed last: a server
    #: stops watching its socket's descriptor before the descriptor goes).
    closers: list[Callable[[], None]] = field(default_factory=list)
    sockets: list[socket.socket] = field(default_factory=list)
    #: True while ``serve`` makes the servers: a ``close`` meanwhile leaves the closing to it
    #: (a socket closed under a server being made leaves the loop watching a closed
    #: descriptor).
    making: bool = True
    #: Set once closed.
    closed: bool = False

    def bind(self, tcp_ports: Sequence[int], dns_port: int, *, transparent: int) -> None:
        """Take the ports (``transparent``: the one whose listener is TPROXY's), or raise
        ``Unavailable`` (the host refuses one) with nothing bound."""
        try:
            for port in tcp_ports:
                self.sockets.append(bound(self.slot.host_ifname, socket.SOCK_STREAM, port,
                                          transparent=port == transparent))
            self.sockets.append(bound(self.slot.host_ifname, socket.SOCK_DGRAM, dns_port))
        except OSError as exc:
            self.making = False
            self.close()
            raise Unavailable(f"the egress proxy of network slot {self.slot.index} could not "
                              f"listen: {exc.strerror or exc}; try again") from exc

    async def serve(self, accepts: Sequence[Accept],
                    dns: Callable[[], asyncio.DatagramProtocol], *, limit: int) -> None:
        """Serve the bound TCP sockets with ``accepts`` (in ``bind``'s order) and the DNS
        socket with ``dns``; after a ``close`` meanwhile, what was made is closed."""
        try:
            for sock, accept in zip(self.sockets, accepts, strict=False):
                if self.closed:
                    return
                server = await asyncio.start_server(accept, sock=sock, limit=limit)
                self.closers.append(server.close)
            if self.closed:
                return
            transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                dns, sock=self.sockets[-1])
            self.closers.append(transport.close)
        finally:
            self.making = False
            if self.closed:
                self.close()

    def close(self) -> None:
        self.closed = True
        if self.making:
            return
        for close in self.closers:
            close()
        for sock in self.sockets:
            sock.close()
