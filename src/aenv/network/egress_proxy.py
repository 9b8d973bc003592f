"""The node's egress proxy: domain rules for HTTP, HTTPS and DNS (docs/security.md, "Egress").

A slot whose policy names domains is in nft's ``intercepted`` set (nft.py): its TCP 80 and 443
and its DNS queries (UDP 53, to whatever server) arrive here, on listeners bound to the slot's
own veth, one set per slot. What is decided, and on what:

* **HTTP**: the request's ``Host`` header; **HTTPS**: the TLS ClientHello's SNI (the TLS is
  not terminated: the bytes pass through — except for a host the sandbox's ``network.rules``
  name, whose TLS the node ends with its CA to set the rule's headers, egress_tls.py). A
  name the policy allows is resolved *here*, by the
  node's resolver, and the connection goes to that address — never to the address the guest
  dialled — so a forged Host or SNI reaches only the name it names, and an IP literal of a
  denied name is judged as an address. No Host or SNI: refused.
* **DNS**: a query for a name the policy denies, or whose every address it denies, answers
  NXDOMAIN; others are answered from the node's resolver. A guest asking another server
  (8.8.8.8, its own) is answered here all the same; DNS over HTTPS is HTTPS to a name.

The policy is read per connection and per query, so ``PUT /network`` applies to the next
one; connections already spliced keep going. Upstream connections leave from the host, so the
never-reachable and internal ranges are checked here too (``egress_rules.py``).

Owns: one listener set per intercepted slot. Must not touch: nft (the pool writes the set).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Protocol

import h11

from aenv.core.errors import AenvError
from aenv.core.net import EgressPolicy, NetSlot
from aenv.network import egress_rules, nft
from aenv.network.egress_dns import DnsAnswers, Resolver
from aenv.network.egress_listeners import SlotListeners
from aenv.network.egress_names import host_header, sni_of
from aenv.network.egress_tls import GuestTls, Interception
from aenv.network.socks_upstream import SocksUpstream, open_via

log = logging.getLogger("aenv.network.egress")

#: A request head or ClientHello larger than this is refused.
MAX_HEAD = 64 << 10
#: Time for a guest to send its request head or ClientHello, and for an upstream to answer
#: the connect.
FIRST_BYTES_S = 30.0
CONNECT_S = 10.0
CHUNK = 64 << 10
_PLACEHOLDER = re.compile(r"\$\{(e2b\.(?:secrets|identity\.tokens)\.[^}]+)\}")
_IDENTITY = "e2b.identity.tokens."
_ANSWER = (b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nConnection: close\r\n"
           b"Content-Length: %d\r\n\r\n%s")


class _Readable(Protocol):
    async def read(self, size: int) -> bytes: ...


class _Writable(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


_Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
_Handler = Callable[["SlotListeners", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class EgressProxy:
    def __init__(self, resolver: Resolver, *, never: Iterable[str], internal: Iterable[str],
                 node_nets: Callable[[], Iterable[str]] = tuple) -> None:
        self.resolver = resolver
        self._never = tuple(never)
        self._internal = tuple(internal)
        self._node_nets = node_nets
        self._slots: dict[int, SlotListeners] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: The value of a team's secret by name (None: not set), for the rules' headers; set
        #: by the node (orchestrator/secrets.py), None: no secret is ever put in.
        self.reveal: Callable[[str | None, str], Awaitable[str | None]] | None = None
        #: A workload identity token of the policy's sandbox by name (None: not registered),
        #: set by the node (orchestrator/workload_identity.py); None: none is ever put in.
        self.mint: Callable[[EgressPolicy, str], Awaitable[str | None]] | None = None
        #: The CA that ends the TLS of hosts with rules (egress_tls.py), set by the node;
        #: None: HTTPS passes through untouched and its rules set nothing.
        self.interception: Interception | None = None

    # -- slots ---------------------------------------------------------------------------------

    async def apply(self, slot: NetSlot, policy: EgressPolicy) -> None:
        """Serve ``slot`` with ``policy`` (listeners made on first use), or stop serving it
        when the policy names no domain.

        The slot is registered before the first await: a second ``apply`` meanwhile only
        changes the policy, and a ``detach`` meanwhile (the sandbox killed) closes what this
        call has made and makes the rest close as it is made. Two calls each binding the
        slot's ports had the second fail with ``EADDRINUSE``; listeners made for a slot
        detached meanwhile outlived it and took the ports of the next slot of that index.
        On failure: ``Unavailable`` when the host refuses a port; nothing stays bound."""
        if not (policy.by_name or policy.egress_proxy):
            self.detach(slot.index)
            return
        held = self._slots.get(slot.index)
        if held is not None:
            held.policy = policy
            return
        held = SlotListeners(slot, policy)
        held.bind((nft.PROXY_HTTP_PORT, nft.PROXY_TLS_PORT, nft.PROXY_TUNNEL_PORT),
                  nft.PROXY_DNS_PORT, transparent=nft.PROXY_TUNNEL_PORT)
        self._slots[slot.index] = held
        try:
            await held.serve(
                [self._accepting(handler, held) for handler in (self._http, self._tls,
                                                                self._tunnel)],
                lambda: DnsAnswers(lambda: held.policy, self.allowed_addresses, self._tasks),
                limit=MAX_HEAD)
        except BaseException:
            self.detach(slot.index, only=held)
            raise

    def detach(self, index: int, *, only: SlotListeners | None = None) -> None:
        """Stop serving slot ``index`` (``only``: if it is still that registration)."""
        held = self._slots.get(index)
        if held is None or (only is not None and held is not only):
            return
        del self._slots[index]
        held.close()

    async def close(self) -> None:
        for index in list(self._slots):
            self.detach(index)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- decisions -----------------------------------------------------------------------------

    def _address_verdict(self, policy: EgressPolicy, address: str,
                         named: bool) -> egress_rules.Verdict:
        return egress_rules.by_address(policy, address, named=named,
                                       never=(*self._never, *self._node_nets()),
                                       internal=self._internal)

    async def target(self, policy: EgressPolicy, host: str) -> tuple[str | None, str]:
        """Where a connection to ``host`` (a name or an IP literal) may go: an address, or
        None and why not."""
        host = host.strip().lower().rstrip(".")
        if _is_ip(host):
            verdict = self._address_verdict(policy, host, named=False)
            return (host if verdict.allowed else None), verdict.why
        by_name = egress_rules.by_name(policy, host)
        if by_name is not None and not by_name.allowed:
            return None, by_name.why
        addresses = await self.resolver.addresses(host)
        if not addresses:
            return None, f"{host} does not resolve"
        reasons = []
        for address in addresses:
            verdict = self._address_verdict(policy, address, named=by_name is not None)
            if verdict.allowed:
                return address, verdict.why
            reasons.append(verdict.why)
        return None, reasons[0]

    async def allowed_addresses(self, policy: EgressPolicy, name: str) -> list[str] | None:
        """The addresses of ``name`` the policy lets the sandbox reach; None: none."""
        by_name = egress_rules.by_name(policy, name)
        if by_name is not None and not by_name.allowed:
            return None
        found = await self.resolver.addresses(name)
        allowed = [a for a in found
                   if self._address_verdict(policy, a, named=by_name is not None).allowed]
        return allowed or None

    # -- connections ---------------------------------------------------------------------------

    def _accepting(self, handler: _Handler, held: SlotListeners) -> Callable[
            [asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(handler, held, reader, writer)
        return accepted

    async def _serve(self, handler: _Handler, held: SlotListeners, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await handler(held, reader, writer)
        except (TimeoutError, OSError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _http(self, held: SlotListeners, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(FIRST_BYTES_S):
            head = await reader.readuntil(b"\r\n\r\n")
        host = host_header(head)
        if host is None:
            await _refuse_http(writer, "no Host header")
            return
        address, why = await self.target(held.policy, host)
        if address is None:
            log.info("slot %d: HTTP to %s refused: %s", held.slot.index, host, why)
            await _refuse_http(writer, why)
            return
        templates = transform_for(held.policy, host)
        name = None if _is_ip(host) else host.strip().lower().rstrip(".")
        if templates:
            await self._relay(held, head, reader, writer,
                              partial(self._open, held.policy, address, 80, name), templates)
            return
        await self._splice(held, head, reader, writer, address, 80, name)

    async def _headers(self, held: SlotListeners, templates: tuple[tuple[str, str], ...]
                       ) -> list[tuple[str, str]] | str:
        """The headers a rule sets, its secrets put in; or why they cannot be."""
        out = []
        for name, template in templates:
            value = template
            for placeholder in set(_PLACEHOLDER.findall(template)):
                if placeholder.startswith(_IDENTITY):
                    token = placeholder.removeprefix(_IDENTITY)
                    found = await self.mint(held.policy, token) if self.mint else None
                    if found is None:
                        return f"iam token '{token}' cannot be minted"
                else:
                    secret = placeholder.removeprefix("e2b.secrets.")
                    try:
                        found = (await self.reveal(held.policy.team_id, secret) if self.reveal
                                 else None)
                    except AenvError as exc:  # the secrets' store cannot be read now
                        return f"secret '{secret}' cannot be read: {exc.message}"
                    if found is None:
                        return f"secret '{secret}' is not set"
                value = value.replace("${" + placeholder + "}", found)
            out.append((name, value))
        return out

    async def _relay(self, held: SlotListeners, head: bytes, reader: _Readable, writer: _Writable,
                     upstream: _Connect, templates: tuple[tuple[str, str], ...]) -> None:
        """HTTP/1.1 request by request (h11), each request given the rule's headers (they
        replace the guest's own of the same name); the secrets never go to the guest.
        ``upstream`` opens the connection to the host (plain, or TLS checked as a client
        would); one that cannot be opened answers 502."""
        guest = h11.Connection(h11.SERVER)
        upstream_h11 = h11.Connection(h11.CLIENT)
        try:
            async with asyncio.timeout(CONNECT_S):
                up_reader, up_writer = await upstream()
        except (OSError, TimeoutError) as exc:
            log.info("slot %d: upstream refused: %s", held.slot.index, exc)
            await _refuse_http(writer, f"the host cannot be reached: {exc}",
                               status=b"502 Bad Gateway")
            return
        try:
            if head:  # (h11 takes b"" for the guest's close)
                guest.receive_data(head)
            while True:
                event = await _next(guest, reader)
                if isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.Request):
                    return
                headers = await self._headers(held, templates)
                if isinstance(headers, str):
                    log.info("slot %d: HTTP refused: %s", held.slot.index, headers)
                    await _refuse_http(writer, headers)
                    return
                names = {n.lower() for n, _ in headers}
                kept = [(n, v) for n, v in event.headers.raw_items()
                        if n.decode("latin-1").lower() not in names]
                up_writer.write(upstream_h11.send(h11.Request(
                    method=event.method, target=event.target,
                    headers=[*kept, *((n.encode(), v.encode()) for n, v in headers)])))
                while True:  # the request's body
                    part = await _next(guest, reader)
                    if isinstance(part, h11.Data | h11.EndOfMessage):
                        up_writer.write(upstream_h11.send(part))
                    if not isinstance(part, h11.Data):
                        break
                await up_writer.drain()
                while True:  # the answer, as it comes
                    answer = await _next(upstream_h11, up_reader)
                    if isinstance(answer, h11.InformationalResponse | h11.Response | h11.Data |
                                  h11.EndOfMessage):
                        writer.write(guest.send(answer))
                        await writer.drain()
                    if isinstance(answer, h11.EndOfMessage | h11.ConnectionClosed):
                        break
                if guest.our_state is not h11.DONE or upstream_h11.our_state is not h11.DONE \
                        or guest.their_state is not h11.DONE:
                    return
                guest.start_next_cycle()
                upstream_h11.start_next_cycle()
        except h11.ProtocolError:
            return
        finally:
            up_writer.close()

    async def _tls(self, held: SlotListeners, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(FIRST_BYTES_S):
            header = await reader.readexactly(5)
        content_type, _, length = struct.unpack("!BHH", header)
        if content_type != 22 or length > MAX_HEAD:
            return
        async with asyncio.timeout(FIRST_BYTES_S):
            record = await reader.readexactly(length)
        name = sni_of(record)
        if name is None:
            log.info("slot %d: TLS without SNI refused", held.slot.index)
            return
        address, why = await self.target(held.policy, name)
        if address is None:
            log.info("slot %d: TLS to %s refused: %s", held.slot.index, name, why)
            return
        templates = transform_for(held.policy, name)
        if templates and self.interception is not None:
            await self._intercept(held, header + record, reader, writer, name, address,
                                  templates)
            return
        await self._splice(held, header + record, reader, writer, address, 443, name)

    async def _intercept(self, held: SlotListeners, hello: bytes, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, name: str, address: str,
                         templates: tuple[tuple[str, str], ...]) -> None:
        """A host with rules over HTTPS: the guest's TLS ends here (a certificate for
        ``name`` from the platform's CA), the host's is opened and checked by the node, and
        the requests between are relayed as plain HTTP's are."""
        interception = self.interception
        assert interception is not None
        guest = GuestTls(await interception.server_context(name), reader, writer, hello,
                         chunk=CHUNK)
        try:
            await guest.handshake(FIRST_BYTES_S)
        except ssl.SSLError as exc:  # the guest does not trust the CA, or speaks no TLS
            log.info("slot %d: TLS to %s not intercepted: %s", held.slot.index, name,
                     exc.reason or exc)
            return
        await self._relay(held, b"", guest, guest, partial(
            self._open, held.policy, address, 443, name, tls=interception.upstream), templates)

    async def _tunnel(self, held: SlotListeners, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """Any other TCP of a slot with a SOCKS5 upstream: the address it dialled (the
        transparent socket's own) judged by the policy, then through the upstream."""
        address, port = writer.get_extra_info("sockname")[:2]
        verdict = self._address_verdict(held.policy, address, named=False)
        if not verdict.allowed:
            log.info("slot %d: TCP to %s:%d refused: %s", held.slot.index, address, port,
                     verdict.why)
            return
        await self._splice(held, b"", reader, writer, address, port, None)

    async def _open(self, policy: EgressPolicy, address: str, port: int, name: str | None,
                    *, tls: ssl.SSLContext | None = None,
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``address`` (decided on for ``name``, when a name decided),
        straight or through the policy's SOCKS5 upstream; ``tls``: TLS on it, checked for
        ``name``. The upstream is given the address, not the name (E2B gives the name): the
        address is what the policy judged, and a proxy resolving the name again could be
        answered another one."""
        if policy.egress_proxy is None:
            async with asyncio.timeout(CONNECT_S):
                return await asyncio.open_connection(
                    address, port, ssl=tls, server_hostname=name if tls else None,
                    ssl_handshake_timeout=CONNECT_S if tls else None)
        up_reader, up_writer = await open_via(_upstream(policy.egress_proxy), address, port,
                                              timeout_s=CONNECT_S)
        if tls is not None:
            try:
                await up_writer.start_tls(tls, server_hostname=name,
                                          ssl_handshake_timeout=CONNECT_S)
            except BaseException:
                up_writer.close()
                raise
        return up_reader, up_writer

    async def _splice(self, held: SlotListeners, first: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, address: str, port: int,
                      name: str | None) -> None:
        try:
            up_reader, up_writer = await self._open(held.policy, address, port, name)
        except OSError as exc:
            log.info("slot %d: %s:%d cannot be reached: %s", held.slot.index,
                     name or address, port, exc)
            return
        try:
            up_writer.write(first)
            await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
        finally:
            up_writer.close()


async def _next(connection: h11.Connection, reader: _Readable) -> object:
    """The next h11 event, reading more as it needs."""
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        async with asyncio.timeout(FIRST_BYTES_S * 10):
            data = await reader.read(CHUNK)
        connection.receive_data(data)


def transform_for(policy: EgressPolicy, host: str) -> tuple[tuple[str, str], ...]:
    """The headers ``policy``'s rules set on requests to ``host`` (the first pattern that
    matches)."""
    for pattern, headers in policy.transforms:
        if egress_rules.matches(host, [pattern]):
            return headers
    return ()


@functools.lru_cache(maxsize=256)
def _upstream(canonical: str) -> SocksUpstream:
    return SocksUpstream.parse(json.loads(canonical))


def _is_ip(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return host.count(".") == 3


async def _refuse_http(writer: _Writable, why: str, *,
                       status: bytes = b"403 Forbidden") -> None:
    body = f"aenv: egress refused: {why}\n".encode()
    writer.write(_ANSWER % (status, len(body), body))
    with contextlib.suppress(OSError):
        await writer.drain()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
