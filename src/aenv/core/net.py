"""What a network slot is. Slots are prepared ahead of time (pooled) and handed to one sandbox.

Every sandbox sees the *same* guest address (so a forked child restored from a memory snapshot
keeps working); the host tells sandboxes apart by their host-side veth, binding sockets to it
(``SO_BINDTODEVICE``) when it connects to a guest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Guest side of every slot (inside the sandbox), and the gateway the guest routes through.
GUEST_IP = "169.254.0.21"
GATEWAY_IP = "169.254.0.22"
PREFIX_LEN = 30
GUEST_MAC = "02:a0:e0:00:00:15"


@dataclass(frozen=True)
class NetSlot:
    #: Slot index; names below derive from it.
    index: int
    #: Network namespace name (``ip netns``) and its path.
    netns: str
    netns_path: str
    #: Host-side veth (root namespace); sockets to the guest bind to it.
    host_ifname: str
    #: Guest-side veth inside the netns (runsc takes it over).
    guest_ifname: str
    guest_ip: str = GUEST_IP
    gateway_ip: str = GATEWAY_IP
    prefix_len: int = PREFIX_LEN
    guest_mac: str = GUEST_MAC
    #: Which lease of the index this is (set by the pool's ``acquire``): a late ``release``
    #: of an earlier lease must not destroy the slot of the sandbox that has it now.
    lease: str = ""


@dataclass(frozen=True)
class EgressPolicy:
    """What a sandbox may reach outside the node (changeable while it runs).

    Evaluated per packet, first match wins: never-reachable ranges (loopback, link-local and
    cloud metadata, multicast, other sandboxes, the node itself, and the node's own networks:
    its addresses, the subnets on its interfaces and their gateways) → ``allow_out`` → ``deny_out``
    → ``allow_internet`` → the node's internal ranges (RFC 1918, CGNAT …) → allowed.
    Entries are IPv4 addresses or CIDRs; sandboxes have no IPv6 egress.
    """

    allow_internet: bool = True
    #: Always reachable, even inside the internal ranges or when ``allow_internet`` is off.
    allow_out: tuple[str, ...] = ()
    #: Never reachable (``0.0.0.0/0`` denies everything ``allow_out`` does not name).
    deny_out: tuple[str, ...] = ()
    #: Domain names (``api.example.com``, ``*.example.com``) allowed / denied by name for
    #: HTTP and HTTPS, matched on the request's Host or TLS SNI by the node's egress proxy
    #: (network/egress_proxy.py). An allowed name wins over any denied address or name.
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    #: E2B's ``network.rules``: per host pattern, the headers set on its HTTP requests (values
    #: may name ``${e2b.secrets.<name>}``), in order.
    transforms: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    #: The team whose secrets the transforms name (None: the default team).
    team_id: str | None = None
    #: E2B's ``iam`` tokens, which the transforms may name as
    #: ``${e2b.identity.tokens.<name>}``: (name, audience, token type) each, minted by the
    #: node for ``sandbox_id`` (not part of the comparison: a policy is the same whoever has it).
    identity: tuple[tuple[str, str, str], ...] = ()
    #: E2B's ``egressProxy``: a SOCKS5 upstream all TCP leaves through (after the rules
    #: above), as canonical JSON (network/socks_upstream.py parses it); None: straight out.
    egress_proxy: str | None = None
    sandbox_id: str | None = field(default=None, compare=False)

    @property
    def by_name(self) -> bool:
        """Whether the slot's HTTP, HTTPS and DNS go through the node's egress proxy."""
        return bool(self.allow_domains or self.deny_domains or self.transforms)
