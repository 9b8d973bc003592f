"""What an egress policy says of a name or an address (pure; network/egress_proxy.py asks).

E2B's order (its ``allow_out`` / ``deny_out``): an allowed name or address wins; then a
denied name or address; then ``allow_internet``. Whatever a policy says, the ranges nft.py
never lets a sandbox reach (loopback, link-local and cloud metadata, multicast, the node's
own networks) stay out of reach, and the node's internal ranges (RFC 1918 …) are reachable
only when ``allow_out`` names them: a name allowed by the policy that resolves into them is
still refused, so an allowed name cannot be pointed at the node's LAN.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from aenv.core.errors import InvalidArgument
from aenv.core.net import EgressPolicy

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
MAX_NAME = 253


def domain_pattern(entry: str) -> str | None:
    """``entry`` as a domain pattern (lowercase, ``*.`` wildcard kept), or None when it is an
    address or CIDR. Raises ``InvalidArgument`` for what is neither."""
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
        return None
    except ValueError:
        pass
    name = entry.strip().lower().rstrip(".")
    body = name[2:] if name.startswith("*.") else name
    if not body or len(body) > MAX_NAME or not all(_LABEL.match(p) for p in body.split(".")):
        raise InvalidArgument(f"{entry!r} is not an IPv4 address, a CIDR or a domain name "
                              "(a leading '*.' matches its subdomains)")
    return name


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``patterns`` (``*.example.com``: any subdomain of
    example.com, not example.com itself)."""
    name = name.lower().rstrip(".")
    for pattern in patterns:
        if pattern.startswith("*."):
            if name.endswith(pattern[1:]):
                return True
        elif name == pattern:
            return True
    return False


def _in(ip: ipaddress.IPv4Address, cidrs: Iterable[str]) -> bool:
    return any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str


def by_name(policy: EgressPolicy, name: str) -> Verdict | None:
    """The verdict the policy gives ``name`` by name, or None when it names it nowhere (its
    addresses then decide)."""
    if matches(name, policy.allow_domains):
        return Verdict(True, f"{name} is allowed by name")
    if matches(name, policy.deny_domains):
        return Verdict(False, f"{name} is denied by the sandbox's network policy")
    return None


def by_address(policy: EgressPolicy, address: str, *, never: Iterable[str],
               internal: Iterable[str], named: bool = False) -> Verdict:
    """The verdict for ``address`` (``named``: reached through a name the policy allowed,
    which passes ``deny_out`` and a closed internet, not the never-reachable or internal
    ranges)."""
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        return Verdict(False, f"{address} is not an IPv4 address (sandboxes have no IPv6)")
    if _in(ip, never):
        return Verdict(False, f"{address} is never reachable from a sandbox")
    if _in(ip, policy.allow_out):
        return Verdict(True, f"{address} is allowed")
    if _in(ip, internal):
        return Verdict(False, f"{address} is in the node's internal ranges")
    if named:
        return Verdict(True, "allowed by name")
    if _in(ip, policy.deny_out):
        return Verdict(False, f"{address} is denied by the sandbox's network policy")
    if not policy.allow_internet:
        return Verdict(False, "the sandbox has no internet access")
    return Verdict(True, "the internet is allowed")
