"""The node's own networks, which no sandbox may reach whatever its egress policy says.

The fixed ranges of nft.py (``never``, ``internal``) cannot know where a node stands: a node on
a LAN with public addresses, a cloud VPC, a VPN or a Docker bridge in a range on neither list
would be open to every sandbox. So the node reads its routing tables (every table, so policy
routing such as Tailscale's table 52 counts too) and denies:

* its own addresses (``local`` routes; the input chain drops them already, this is belt and
  braces for traffic the host forwards);
* every subnet on its interfaces (routes without a gateway: on-link, i.e. the LAN itself);
* every gateway of its routes (the LAN's router, which is often a management box too).

Destinations *behind* a gateway stay reachable: that is the internet. On-link routes broader
than ``MIN_ONLINK_PREFIX`` are skipped, because they are the way out (``default dev wg0``,
OpenVPN's ``0.0.0.0/1``), not a LAN. The slots' own plumbing (169.254.0.20/30 on every host veth,
the return routes) is skipped: it belongs to the ``never`` set and to the isolation rules.

Owns: nothing on the machine; it only reads. The set in the nft table is written by pool.py.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any

from aenv.core import proc
from aenv.core.errors import CommandError, Internal
from aenv.network.slots import HOST_IF_PREFIX

#: One ``ip`` call takes a few ms; the margin covers a loaded machine (RTNL contention).
IP_TIMEOUT_S = 15.0
#: On-link routes broader than this are a way out (a tunnel's default), not a network to deny.
MIN_ONLINK_PREFIX = 8
#: Route types that carry traffic to a network; the others (broadcast, blackhole, unreachable,
#: prohibit, throw, multicast) name nothing a sandbox could reach through the host.
_UNICAST = {"unicast", "local", "anycast"}

Network = ipaddress.IPv4Network


def from_routes(routes: Iterable[Mapping[str, Any]]) -> tuple[Network, ...]:
    """The networks to deny, from ``ip -4 -j route show table all`` (pure; sorted, collapsed)."""
    nets: list[Network] = []
    for route in routes:
        if route.get("type", "unicast") not in _UNICAST:
            continue
        hops = route.get("nexthops") or [route]
        if all(str(hop.get("dev", "")).startswith(HOST_IF_PREFIX) for hop in hops):
            continue  # a slot's own subnet, address or return route
        dst = _network(route.get("dst"))
        if route.get("type") in ("local", "anycast"):
            if dst is not None and dst.prefixlen > 0:
                # (``local default``: a TPROXY's delivery table — the egress tunnel's,
                # nft.TUNNEL_TABLE — not addresses of the node)
                nets.append(dst)
            continue
        gateways = [_network(hop.get("gateway")) for hop in hops]
        nets += [gw for gw in gateways if gw is not None and gw.prefixlen == 32]
        routed = any("gateway" in hop or "via" in hop for hop in hops)
        if not routed and dst is not None and dst.prefixlen >= MIN_ONLINK_PREFIX:
            nets.append(dst)
        src = _network(route.get("prefsrc"))
        if src is not None:
            nets.append(src)
    return tuple(ipaddress.collapse_addresses(nets))


def _network(value: object) -> Network | None:
    if not isinstance(value, str) or not value:
        return None
    if value == "default":
        return Network("0.0.0.0/0")
    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return None
    return net if isinstance(net, Network) else None


async def read() -> tuple[Network, ...]:
    """The node's networks as the kernel routes them now.

    Prerequisites: ``ip`` (iproute2 with JSON output) installed.
    On success: returns the networks (see ``from_routes``). On failure: raises ``Internal``.
    """
    try:
        done = await proc.run(
            ["ip", "-4", "-j", "route", "show", "table", "all"], timeout=IP_TIMEOUT_S
        )
        routes = json.loads(done.stdout or b"[]")
    except (CommandError, ValueError) as exc:
        raise Internal(f"cannot read the node's routes: {exc}") from exc
    if not isinstance(routes, list):
        raise Internal("cannot read the node's routes: ip printed no list")
    return from_routes(r for r in routes if isinstance(r, dict))
