"""The node's own networks, read from its routes (pure), and the nft set that holds them."""

from __future__ import annotations

import ipaddress
import subprocess
from typing import Any

from aenv.core.net import EgressPolicy
from aenv.network import nft, node_nets

#: ``ip -4 -j route show table all`` of a node on a public-range LAN with a VPN, policy
#: routing, a Docker bridge and two sandbox slots (trimmed to the fields that matter).
ROUTES: list[dict[str, Any]] = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
    {
        "dst": "192.0.2.0/24",
        "dev": "eth0",
        "protocol": "kernel",
        "scope": "link",
        "prefsrc": "192.0.2.2",
    },
    {"dst": "172.17.0.0/16", "dev": "docker0", "scope": "link", "prefsrc": "172.17.0.1"},
    # A static route to a site behind another router on the LAN: its gateway is denied, the
    # site itself is as reachable as the internet is.
    {"dst": "203.0.113.0/24", "gateway": "192.0.2.254", "dev": "eth0"},
    # Multipath: every hop's gateway.
    {
        "dst": "198.51.100.0/24",
        "nexthops": [
            {"gateway": "192.0.2.10", "dev": "eth0"},
            {"gateway": "192.0.2.11", "dev": "eth0"},
        ],
    },
    # Ways out, not networks: a tunnel's default and OpenVPN's half-defaults without gateway.
    {"dst": "default", "dev": "wg0", "table": "51820", "scope": "link"},
    {"dst": "0.0.0.0/1", "dev": "tun0", "scope": "link"},
    # Tailscale's table 52: one peer on-link.
    {"dst": "100.100.1.7", "dev": "tailscale0", "table": "52", "scope": "link"},
    # An IPv6 next hop (RFC 5549): routed, so not on-link.
    {"dst": "192.88.99.0/24", "via": {"family": "inet6", "host": "fe80::1"}, "dev": "eth1"},
    # local table: the node's addresses.
    {"type": "local", "dst": "192.0.2.2", "dev": "eth0", "table": "local"},
    {"type": "local", "dst": "127.0.0.0/8", "dev": "lo", "table": "local"},
    {"type": "broadcast", "dst": "192.0.2.255", "dev": "eth0", "table": "local"},
    {"type": "blackhole", "dst": "233.252.0.0/24"},
    {"type": "unreachable", "dst": "192.31.196.0/24"},
    # The slots' plumbing.
    {"dst": "169.254.0.20/30", "dev": "aenv-h7", "scope": "link", "prefsrc": "169.254.0.22"},
    {"dst": "198.18.0.7", "gateway": "169.254.0.21", "dev": "aenv-h7"},
    {"type": "local", "dst": "169.254.0.22", "dev": "aenv-h7", "table": "local"},
    # The egress tunnel's TPROXY delivery (nft.TUNNEL_TABLE): every address, locally.
    {"type": "local", "dst": "default", "dev": "lo", "table": "4145"},
]


def _nets(*cidrs: str) -> tuple[ipaddress.IPv4Network, ...]:
    return tuple(ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in cidrs))


def test_addresses_subnets_and_gateways_not_what_lies_behind_them() -> None:
    assert node_nets.from_routes(ROUTES) == _nets(
        "192.0.2.0/24",  # the LAN (gateways .1, .10, .11, .254 and address .2 are in it)
        "172.17.0.0/16",  # the Docker bridge
        "100.100.1.7/32",  # the Tailscale peer
        "127.0.0.0/8",
    )


def test_gateways_outside_every_subnet_count_alone() -> None:
    routes = [
        {"dst": "default", "gateway": "203.0.113.1", "dev": "eth0", "flags": ["onlink"]},
        {"dst": "203.0.113.77", "dev": "eth0", "scope": "link"},
        {"type": "local", "dst": "203.0.113.77", "dev": "eth0", "table": "local"},
    ]
    assert node_nets.from_routes(routes) == _nets("203.0.113.1/32", "203.0.113.77/32")


def test_nothing_to_deny_and_junk_are_handled() -> None:
    assert node_nets.from_routes([]) == ()
    junk: list[dict[str, Any]] = [{"dst": "not an address", "dev": "eth0"}, {"gateway": 5}]
    assert node_nets.from_routes(junk) == ()


def test_the_set_script_replaces_the_set_atomically() -> None:
    script = node_nets.from_routes(ROUTES)
    lines = nft.node_nets_script(script).splitlines()
    assert lines[0] == "flush set inet aenv node_nets"
    assert lines[1].startswith("add element inet aenv node_nets { ")
    assert "192.0.2.0/24" in lines[1]
    assert nft.node_nets_script(()) == "flush set inet aenv node_nets\n"


def test_the_node_set_comes_before_every_policy() -> None:
    """``allow_out`` cannot open the node's networks: the drop precedes the slot's chain."""
    table = nft.render_table()
    from_guest = table[table.index("chain from_guest") :]
    assert from_guest.index("@node_nets drop") < from_guest.index("vmap @egress_of_if")


def test_the_table_with_the_set_filled_is_valid_nft() -> None:
    """``nft -c`` parses and type-checks without changing anything (needs root)."""
    table = nft.render_table().replace("table inet aenv ", "table inet aenvcheck ", 1)
    entry = nft.SlotEntry(index=7, ifname="aenv-h7", return_ip="198.18.0.7")
    slot = nft.add_slot_script(entry, EgressPolicy(allow_out=("192.0.2.0/24",)))
    fill = nft.node_nets_script(node_nets.from_routes(ROUTES))
    script = table + (slot + fill).replace("inet aenv ", "inet aenvcheck ")
    done = subprocess.run(["nft", "-c", "-f", "-"], input=script, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
