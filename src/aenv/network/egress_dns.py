"""The egress proxy's DNS (docs/security.md, "Egress"): the node's resolver, and the answers a
slot whose policy names domains gets to every query it sends (network/egress_proxy.py binds
one :class:`DnsAnswers` per slot).

Owns: nothing that outlives a query but the resolver's cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import cast

import dns.asyncresolver
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.resolver
import dns.rrset

from aenv.core.net import EgressPolicy
from aenv.network import egress_rules


class Resolver:
    """A name's addresses from the node's resolver (``nameservers``: these servers; empty:
    the host's resolv.conf), kept for their TTL (at most ``MAX_TTL_S``; a failure for
    ``NEGATIVE_TTL_S``) so that a connection does not wait for a DNS round trip each time."""

    MAX_TTL_S = 60.0
    NEGATIVE_TTL_S = 5.0
    MAX_NAMES = 10_000

    def __init__(self, nameservers: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        servers = list(nameservers)
        self._resolver = dns.asyncresolver.Resolver(configure=not servers)
        if servers:
            self._resolver.nameservers = servers
        self._resolver.lifetime = 5.0
        self._clock = clock
        self._cache: dict[str, tuple[float, list[str]]] = {}

    async def addresses(self, name: str) -> list[str]:
        now = self._clock()
        cached = self._cache.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            answer = await self._resolver.resolve(name, "A")
            found = [r.to_text() for r in answer]
            ttl = min(float(answer.rrset.ttl if answer.rrset else 0), self.MAX_TTL_S)
        except (dns.exception.DNSException, OSError):
            found, ttl = [], self.NEGATIVE_TTL_S
        if len(self._cache) >= self.MAX_NAMES:
            self._cache.clear()
        self._cache[name] = (now + ttl, found)
        return found


class DnsAnswers(asyncio.DatagramProtocol):
    """One slot's DNS: a name its policy denies, or whose every address it denies, is
    NXDOMAIN; an A query of another is answered with the addresses ``allowed`` gives."""

    def __init__(self, policy: Callable[[], EgressPolicy],
                 allowed: Callable[[EgressPolicy, str], Awaitable[list[str] | None]],
                 tasks: set[asyncio.Task[None]]) -> None:
        self.policy = policy
        self.allowed = allowed
        self.tasks = tasks
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | bytes, int]) -> None:
        task = asyncio.create_task(self._answer(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str | bytes, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
        else:
            question = query.question[0]
            name = question.name.to_text(omit_final_dot=True)
            policy = self.policy()
            verdict = egress_rules.by_name(policy, name)
            if question.rdtype == dns.rdatatype.A:
                addresses = await self.allowed(policy, name)
                if addresses is None:
                    response.set_rcode(dns.rcode.NXDOMAIN)
                else:
                    response.answer.append(dns.rrset.from_text_list(
                        question.name, 30, dns.rdataclass.IN, dns.rdatatype.A, addresses))
            elif verdict is not None and not verdict.allowed:
                response.set_rcode(dns.rcode.NXDOMAIN)
            # Other types of other names (AAAA: sandboxes have no IPv6): an empty answer.
        if self.transport is not None:
            with contextlib.suppress(OSError):
                self.transport.sendto(response.to_wire(), addr)
