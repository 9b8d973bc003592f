"""The nftables ruleset of sandbox networking: one table, ``inet aenv``, and nothing else.

Every sandbox has the same address (169.254.0.21) behind its own host veth ``aenv-h<n>``. That
makes three things non-obvious, each solved by a part of the table:

* **Conntrack would merge sandboxes.** Two sandboxes connecting from 169.254.0.21:40000 to the
  same destination have identical tuples. Each slot gets conntrack zone ``n`` (map
  ``zone_of_if``), set in the raw hooks before conntrack runs:
  - guest → host (169.254.0.22; replies to the host's own connections to envd/user ports) and
    host → guest (output): zone ``n`` in *both* directions, so the host may hold identical
    tuples to several guests at once;
  - guest → elsewhere (egress): zone ``n`` for the *original* direction only. The reply
    direction stays in zone 0, where replies arriving from the uplink are looked up; the
    masquerade's port allocation keeps the reply tuples unique there.
* **Replies cannot be routed by destination.** After de-NAT, a reply is addressed to
  169.254.0.21, which sits behind every veth. ``reply_to_slot`` rewrites it to the slot's
  *return address* (``return_of_zone``, keyed by the connection's original zone), which has a
  host route via the right veth (slots.py), and ``reply_unalias`` rewrites it back on the way
  out. Only the outer header changes: ICMP errors keep their correctly de-NATed inner header.
* **Locally generated packets to 169.254.0.21 are ambiguous.** A reject/ICMP error/RST the host
  makes for a guest packet would be routed by destination alone, i.e. to some other sandbox.
  So blocked guest traffic is *dropped*, never rejected, and host-generated ICMP errors and
  invalid packets towards guests are dropped in ``host_out``. Sockets the host opens to a guest
  bind to the veth (``SO_BINDTODEVICE``) and are unaffected.

* **Names need a proxy.** A slot whose policy names domains is in ``intercepted``: its TCP 80
  and 443 and its DNS (UDP 53, to any server) are sent (DNAT) to the node's egress proxy on
  the slot's gateway address, which decides on the Host header, the TLS SNI or the query
  name. These connections are in zone ``n`` in *both* directions (``guest_raw``), like the
  guest's traffic to the host, so the proxy's replies (locally generated, from a socket bound
  to the slot's veth) find their connection and are un-NATed. A guest cannot reach the
  proxy's ports but through the DNAT (``guest_to_host`` accepts only DNATed connections).
* **A SOCKS5 upstream takes all TCP.** A slot in ``tunnelled`` (E2B ``egressProxy``) has
  every TCP connection but to the gateway (and but 80/443 when it is also ``intercepted``)
  taken by TPROXY (``tunnel``, at mangle priority, before any NAT) to the egress proxy's
  tunnel listener, marked ``TUNNEL_MARK`` so that the host's routing delivers it locally
  (slots.py's rule and table). The destination is not rewritten: the transparent listener's
  accepted socket *is* the guest's destination, whatever conntrack zone the connection is in
  (``SO_ORIGINAL_DST`` only looks in zone 0). Zone ``n`` in both directions, as for the
  DNATed ports; the proxy applies the policy's address rules itself.

Isolation: a guest reaches nothing on the host but replies to the host's own connections; no
guest reaches another (forward between veths is dropped; other slots' return addresses are in
``never``); nothing outside may open a connection to a guest; guests have no IPv6 and cannot
spoof their source. Egress: ``never`` (loopback, link-local incl. 169.254.169.254, multicast,
the return range) and ``node_nets`` (the node's own addresses, subnets and gateways, read from
its routes by node_nets.py and kept current by pool.py) are dropped whatever the policy; then
the slot's own chain ``slot_<n>`` (EgressPolicy, replaceable at run time) decides; a slot
without a chain reaches nothing. Allowed traffic leaves masqueraded on whatever interface the
host routes it to.

Owns: the ``inet aenv`` table. Must not touch: any other table or chain; sysctls and links
(slots.py). Writes are atomic nft transactions; per-slot scripts are idempotent (nft 1.0.6 has
no ``destroy``, so removals first ``add`` the same objects and then delete them).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from aenv.core import proc
from aenv.core.errors import CommandError, Internal, InvalidArgument
from aenv.core.net import GATEWAY_IP, GUEST_IP, EgressPolicy
from aenv.network.slots import HOST_IF_PREFIX

FAMILY = "inet"
TABLE = "aenv"
QUALIFIED = f"{FAMILY} {TABLE}"
#: nft loads a table of this size in a few ms; the margin covers a loaded machine.
NFT_TIMEOUT_S = 15.0
HOST_IF_GLOB = f'"{HOST_IF_PREFIX}*"'

#: Never reachable from a sandbox, whatever its policy says: this-network, loopback, link-local
#: (cloud metadata 169.254.169.254, the slots' own 169.254.0.0/30s), multicast, reserved and
#: broadcast. The return range is added at render time.
NEVER = ("0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4")
#: The node's private surroundings, denied unless a policy's ``allow_out`` names them: RFC 1918,
#: CGNAT (also Tailscale's), IETF protocol assignments, benchmarking.
INTERNAL = (
    "10.0.0.0/8",
    "100.64.0.0/10",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
)
#: Default range of the slots' return addresses (RFC 2544 benchmarking: nothing real uses it).
RETURN_NET = "198.18.0.0/15"
#: Where a slot in ``intercepted`` has its HTTP, HTTPS and DNS sent: the node's egress proxy
#: (network/egress_proxy.py), listening on the slot's own veth (so these ports serve every
#: slot, one listener each, and two nodes on one machine never collide).
PROXY_HTTP_PORT = 49080
PROXY_TLS_PORT = 49443
PROXY_DNS_PORT = 49053
#: Where a slot in ``tunnelled`` (E2B ``egressProxy``) has every other TCP connection sent, by
#: TPROXY: the egress proxy's tunnel listener (transparent, so the accepted socket's own
#: address is the one the guest dialled), which opens it through the SOCKS5 upstream.
PROXY_TUNNEL_PORT = 49100
#: The mark TPROXY puts on those packets, and the routing table that delivers marked packets
#: locally (slots.py writes the rule and the route).
TUNNEL_MARK = 0x4145
TUNNEL_TABLE = 4145


def chain_of(index: int) -> str:
    return f"slot_{index}"


def _interval_set(name: str, cidrs: Iterable[str]) -> str:
    nets = ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in cidrs)
    elements = ", ".join(str(n) for n in nets)
    return f"set {name} {{ type ipv4_addr; flags interval; elements = {{ {elements} }}; }}"


def render_table(*, return_net: str = RETURN_NET, internal: Iterable[str] = INTERNAL) -> str:
    """The static table (no slot in it), with a comment naming its digest.

    Pure. The digest lets ``ensure_table`` tell an up-to-date table (keep it, and the slots in
    it) from one written by another version of aenv (replace it).
    """
    body = f"""
    map zone_of_if {{ typeof iifname : ct zone; }}
    map return_of_zone {{ typeof ct zone : ip daddr; }}
    map egress_of_if {{ type ifname : verdict; }}
    {_interval_set("never", [*NEVER, return_net])}
    {_interval_set("internal", internal)}
    set node_nets {{ type ipv4_addr; flags interval; }}
    set intercepted {{ type ifname; }}
    set tunnelled {{ type ifname; }}

    chain guest_raw {{
        type filter hook prerouting priority raw; policy accept;
        iifname != {HOST_IF_GLOB} return
        meta nfproto != ipv4 drop
        ip saddr != {GUEST_IP} drop
        ip daddr {GATEWAY_IP} ct zone set iifname map @zone_of_if return
        iifname @intercepted tcp dport {{ 80, 443 }} ct zone set iifname map @zone_of_if return
        iifname @intercepted udp dport 53 ct zone set iifname map @zone_of_if return
        iifname @tunnelled meta l4proto tcp ct zone set iifname map @zone_of_if return
        ct original zone set iifname map @zone_of_if
    }}
    chain tunnel {{
        type filter hook prerouting priority mangle; policy accept;
        iifname != @tunnelled return
        ip daddr {GATEWAY_IP} return
        iifname @intercepted tcp dport {{ 80, 443 }} return
        meta l4proto tcp tproxy ip to :{PROXY_TUNNEL_PORT} meta mark set {TUNNEL_MARK} accept
    }}
    chain host_raw {{
        type filter hook output priority raw; policy accept;
        oifname {HOST_IF_GLOB} ct zone set oifname map @zone_of_if
    }}
    chain host_out {{
        type filter hook output priority filter; policy accept;
        oifname {HOST_IF_GLOB} jump host_to_guest
    }}
    chain host_to_guest {{
        icmp type {{ destination-unreachable, time-exceeded, parameter-problem, redirect }} drop
        ct state {{ invalid, related }} drop
    }}
    chain reply_to_slot {{
        type filter hook prerouting priority dstnat + 10; policy accept;
        ip daddr {GUEST_IP} ct direction reply ip daddr set ct original zone map @return_of_zone
    }}
    chain reply_unalias {{
        type filter hook postrouting priority srcnat + 10; policy accept;
        oifname {HOST_IF_GLOB} ip daddr {return_net} ip daddr set {GUEST_IP}
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname {HOST_IF_GLOB} jump guest_to_host
    }}
    chain guest_to_host {{
        ct state established,related accept
        iifname @intercepted ct status dnat tcp dport {{ {PROXY_HTTP_PORT}, {PROXY_TLS_PORT} }} \
            accept
        iifname @intercepted ct status dnat udp dport {PROXY_DNS_PORT} accept
        iifname @tunnelled meta l4proto tcp meta mark {TUNNEL_MARK} accept
        drop
    }}
    chain intercept {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname != @intercepted return
        tcp dport 80 dnat ip to {GATEWAY_IP}:{PROXY_HTTP_PORT}
        tcp dport 443 dnat ip to {GATEWAY_IP}:{PROXY_TLS_PORT}
        udp dport 53 dnat ip to {GATEWAY_IP}:{PROXY_DNS_PORT}
    }}
    chain forward {{
        type filter hook forward priority filter; policy accept;
        oifname {HOST_IF_GLOB} jump to_guest
        iifname {HOST_IF_GLOB} jump from_guest
    }}
    chain to_guest {{
        iifname {HOST_IF_GLOB} drop
        ip daddr != {return_net} drop
        ct state established,related accept
        drop
    }}
    chain from_guest {{
        ip daddr @never drop
        ip daddr @node_nets drop
        iifname vmap @egress_of_if
        drop
    }}
    chain egress_nat {{
        type nat hook postrouting priority srcnat; policy accept;
        oifname != {HOST_IF_GLOB} ip saddr {GUEST_IP} masquerade
    }}
"""
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    return f'table {QUALIFIED} {{\n    comment "aenv {digest}"\n{body}}}\n'


def digest_of(ruleset: str) -> str:
    start = ruleset.index('comment "aenv ') + len('comment "aenv ')
    return ruleset[start : ruleset.index('"', start)]


def node_nets_script(nets: Iterable[ipaddress.IPv4Network]) -> str:
    """Commands that replace the contents of ``node_nets`` with ``nets``, atomically (a packet
    sees the old set or the new one, never an empty one in between)."""
    lines = [f"flush set {QUALIFIED} node_nets"]
    collapsed = ", ".join(str(n) for n in ipaddress.collapse_addresses(nets))
    if collapsed:
        lines.append(f"add element {QUALIFIED} node_nets {{ {collapsed} }}")
    return "\n".join(lines) + "\n"


def policy_rules(policy: EgressPolicy) -> list[str]:
    """The rules of a slot's chain for ``policy`` (pure; raises ``InvalidArgument``)."""
    rules = []
    allow = _v4_set(policy.allow_out)
    deny = _v4_set(policy.deny_out)
    if allow:
        rules.append(f"ip daddr {allow} accept")
    if deny:
        rules.append(f"ip daddr {deny} drop")
    if not policy.allow_internet:
        rules.append("drop")
    else:
        rules.append("ip daddr @internal drop")
        rules.append("accept")
    return rules


def _v4_set(entries: Iterable[str]) -> str:
    nets = []
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError as exc:
            raise InvalidArgument(f"egress rule {entry!r} is not an IP address or CIDR") from exc
        if isinstance(net, ipaddress.IPv4Network):
            nets.append(net)
        # IPv6 entries have nothing to act on: sandboxes have no IPv6 egress at all.
    if not nets:
        return ""
    return "{ " + ", ".join(str(n) for n in ipaddress.collapse_addresses(nets)) + " }"


@dataclass(frozen=True)
class SlotEntry:
    """What the table holds for one slot."""

    index: int
    ifname: str
    return_ip: str


def add_slot_script(entry: SlotEntry, policy: EgressPolicy | None) -> str:
    """Commands that give ``entry`` its zone, return address and egress chain. Idempotent.

    With ``policy`` None an existing chain keeps its rules (a missing one is created empty,
    which drops everything: fail closed).
    """
    chain = chain_of(entry.index)
    lines = [f"add chain {QUALIFIED} {chain}"]
    if policy is not None:
        lines += _policy_lines(entry.index, policy)
    lines += [
        f'add element {QUALIFIED} zone_of_if {{ "{entry.ifname}" : {entry.index} }}',
        f"add element {QUALIFIED} return_of_zone {{ {entry.index} : {entry.return_ip} }}",
        f'add element {QUALIFIED} egress_of_if {{ "{entry.ifname}" : jump {chain} }}',
    ]
    return "\n".join(lines) + "\n"


def remove_slot_script(entry: SlotEntry) -> str:
    """Commands that remove everything of ``entry`` from the table. Idempotent."""
    chain = chain_of(entry.index)
    return (
        add_slot_script(entry, None)
        + "".join(line + "\n" for line in _intercept_lines(entry.index, False))
        + "".join(line + "\n" for line in _set_lines("tunnelled", entry.index, False))
        + f'delete element {QUALIFIED} egress_of_if {{ "{entry.ifname}" }}\n'
        + f"delete element {QUALIFIED} return_of_zone {{ {entry.index} }}\n"
        + f'delete element {QUALIFIED} zone_of_if {{ "{entry.ifname}" }}\n'
        + f"flush chain {QUALIFIED} {chain}\n"
        + f"delete chain {QUALIFIED} {chain}\n"
    )


def _policy_lines(index: int, policy: EgressPolicy) -> list[str]:
    chain = chain_of(index)
    return [
        f"flush chain {QUALIFIED} {chain}",
        *(f"add rule {QUALIFIED} {chain} {rule}" for rule in policy_rules(policy)),
        *_intercept_lines(index, policy.by_name),
        *_set_lines("tunnelled", index, policy.egress_proxy is not None),
    ]


def policy_script(index: int, policy: EgressPolicy) -> str:
    """Commands that replace slot ``index``'s egress rules, atomically."""
    return "\n".join([f"add chain {QUALIFIED} {chain_of(index)}", *_policy_lines(index, policy)])


def _intercept_lines(index: int, on: bool) -> list[str]:
    return _set_lines("intercepted", index, on)


def _set_lines(name: str, index: int, on: bool) -> list[str]:
    element = f'{{ "{HOST_IF_PREFIX}{index}" }}'
    add = f"add element {QUALIFIED} {name} {element}"
    # Removal is idempotent the nft 1.0.6 way: add, then delete.
    return [add] if on else [add, f"delete element {QUALIFIED} {name} {element}"]


@dataclass
class TableState:
    """The live table as ``nft -j`` lists it."""

    #: Slot index → host ifname, from ``zone_of_if``.
    slots: dict[int, str] = field(default_factory=dict)
    #: Indices with a ``slot_<n>`` chain (possibly without map entries, after a crash).
    chains: set[int] = field(default_factory=set)


async def apply(script: str) -> None:
    """Run ``script`` as one nft transaction (all or nothing).

    Prerequisites: root; the table exists for scripts that refer to it.
    On success: every command took effect. On failure: none did; raises ``Internal``.
    """
    try:
        await proc.run(["nft", "-f", "-"], input=script.encode(), timeout=NFT_TIMEOUT_S)
    except CommandError as exc:
        raise Internal(f"nft failed: {exc.stderr.strip() or exc}") from exc


async def ensure_table(ruleset: str) -> bool:
    """Create the table, or replace it when it was written from another ruleset.

    Prerequisites: root; ``ruleset`` from ``render_table``.
    On success: the table matches ``ruleset``. Returns True when it was (re)created, which
    means it holds no slot: the caller re-adds the slots it keeps. An up-to-date table is left
    alone, slots and policies included.
    On failure: raises ``Internal``; the previous table, if any, is unchanged (atomic).
    """
    listed = await proc.run(
        ["nft", "list", "table", *QUALIFIED.split()], check=False, timeout=NFT_TIMEOUT_S
    )
    if listed.returncode == 0 and f'comment "aenv {digest_of(ruleset)}"' in listed.text:
        return False
    # "add table" first so that "delete table" cannot fail on a missing table.
    await apply(f"add table {QUALIFIED}\ndelete table {QUALIFIED}\n{ruleset}")
    return True


async def delete_table() -> None:
    """Remove the whole table (uninstall, tests). Idempotent."""
    await apply(f"add table {QUALIFIED}\ndelete table {QUALIFIED}\n")


async def read_table() -> TableState | None:
    """The slots the live table knows, or None when there is no table."""
    listed = await proc.run(
        ["nft", "-j", "list", "table", *QUALIFIED.split()], check=False, timeout=NFT_TIMEOUT_S
    )
    if listed.returncode != 0:
        return None
    state = TableState()
    for item in json.loads(listed.stdout).get("nftables", []):
        if "map" in item and item["map"].get("name") == "zone_of_if":
            for ifname, zone in item["map"].get("elem", []):
                if isinstance(ifname, str) and isinstance(zone, int):
                    state.slots[zone] = ifname
        elif "chain" in item:
            name = item["chain"].get("name", "")
            if name.startswith("slot_") and name[5:].isdigit():
                state.chains.add(int(name[5:]))
    return state
