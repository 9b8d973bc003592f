"""Create and destroy one network slot; find the slots that exist on the machine.

A slot is a network namespace ``aenv-<index>`` holding the guest end (``eth0``, 169.254.0.21/30,
a fixed MAC, default route via 169.254.0.22) of a veth pair whose host end ``aenv-h<index>``
(169.254.0.22/30) stays in the root namespace. Every slot looks the same from inside, so a
sandbox restored from another's memory image finds its network unchanged; the host tells slots
apart by the host veth (sockets bound to it with ``SO_BINDTODEVICE``, see guest_http.py).

Each slot also gets one host route, ``<return address>/32 via 169.254.0.21 dev aenv-h<index>``.
Replies to a sandbox's NATed egress connections are de-NATed to 169.254.0.21, which every slot
has, so routing alone cannot tell which veth they belong to; the nft table (nft.py) rewrites
their destination to the slot's *return address* (one per slot, from a reserved range) so the
route above picks the right veth, and back to 169.254.0.21 on the way out. The route disappears
with the veth, so a crash leaves nothing routing-wise that the veth's deletion does not remove.

Owns: netns, veths and routes named ``aenv-<n>`` / ``aenv-h<n>``, and the two sysctls the node
needs (``ip_forward``; IPv6 off on host veths). Must not touch: any other netns, link or route;
the nft table (nft.py); the pool's bookkeeping (pool.py).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from aenv.core import proc
from aenv.core.errors import CommandError, Internal, InvalidArgument
from aenv.core.net import GATEWAY_IP, GUEST_IP, GUEST_MAC, PREFIX_LEN, NetSlot

log = logging.getLogger("aenv.network")

#: Names of what a slot owns. Both fit IFNAMSIZ (15) for every index up to MAX_INDEX.
NETNS_PREFIX = "aenv-"
HOST_IF_PREFIX = "aenv-h"
GUEST_IFNAME = "eth0"
#: Where ``ip netns`` keeps its namespaces (runsc joins the one named in config.json).
NETNS_DIR = Path("/run/netns")
SYS_NET = Path("/sys/class/net")
PROC_SYS = Path("/proc/sys/net")
#: Conntrack zones are 16 bits and a slot's zone is its index (0 is the default zone).
MIN_INDEX = 1
MAX_INDEX = 65_535
#: Two ``ip -batch`` runs take ~11 ms; the margin covers a loaded machine (RTNL contention).
IP_TIMEOUT_S = 15.0

_NETNS_RE = re.compile(r"^aenv-(\d+)$")
_HOST_IF_RE = re.compile(r"^aenv-h(\d+)$")


def netns_name(index: int) -> str:
    return f"{NETNS_PREFIX}{index}"


def host_ifname(index: int) -> str:
    return f"{HOST_IF_PREFIX}{index}"


def host_mac(index: int) -> str:
    """The host end's MAC: locally administered, one per slot (written, not random, so each
    side's neighbour entry is known before anything is created)."""
    check_index(index)
    return f"02:ae:00:00:{index >> 8:02x}:{index & 0xFF:02x}"


def check_index(index: int) -> None:
    if not MIN_INDEX <= index <= MAX_INDEX:
        raise InvalidArgument(f"slot index {index} outside {MIN_INDEX}..{MAX_INDEX}")


def slot_for(index: int) -> NetSlot:
    """The slot description for ``index`` (pure: says nothing about whether it exists)."""
    check_index(index)
    name = netns_name(index)
    return NetSlot(
        index=index,
        netns=name,
        netns_path=str(NETNS_DIR / name),
        host_ifname=host_ifname(index),
        guest_ifname=GUEST_IFNAME,
    )


def return_address(index: int, return_net: str) -> str:
    """The slot's return address: ``index``-th address of ``return_net`` (see module doc)."""
    check_index(index)
    net = ipaddress.IPv4Network(return_net)
    if index >= net.num_addresses - 1:
        raise InvalidArgument(f"slot index {index} does not fit return range {return_net}")
    return str(net.network_address + index)


def existing() -> set[int]:
    """Indices of every slot with a netns or a host veth on the machine (cheap: no process).

    Only names matching exactly ``aenv-<digits>`` / ``aenv-h<digits>`` count, so test peers or
    anything else merely starting with ``aenv`` are never taken for slots.
    """
    found: set[int] = set()
    for directory, pattern in ((NETNS_DIR, _NETNS_RE), (SYS_NET, _HOST_IF_RE)):
        try:
            names = [p.name for p in directory.iterdir()]
        except FileNotFoundError:
            continue
        for name in names:
            match = pattern.match(name)
            if match:
                found.add(int(match.group(1)))
    return found


def exists(index: int) -> bool:
    """Whether any part (netns or host veth) of slot ``index`` exists."""
    return (NETNS_DIR / netns_name(index)).exists() or (SYS_NET / host_ifname(index)).exists()


def whole(index: int) -> bool:
    """Whether both the netns and the host veth of slot ``index`` exist (a slot missing either
    cannot carry a sandbox's traffic, or cannot be joined by a restore)."""
    return (NETNS_DIR / netns_name(index)).exists() and (SYS_NET / host_ifname(index)).exists()


async def create(index: int, *, return_ip: str) -> NetSlot:
    """Create slot ``index``: netns, veth pair, addresses, guest default route, return route.

    Prerequisites: no part of the slot exists (``exists(index)`` is false); root.
    On success: the netns and both veth ends exist and are up with their addresses; the host
    end has no IPv6; the returned slot is ready for one sandbox.
    On failure: whatever was created is removed again; raises ``Internal`` with ``ip``'s
    stderr (e.g. "File exists" when another process took the index meanwhile).
    """
    slot = slot_for(index)
    host_side = "\n".join(
        [
            f"netns add {slot.netns}",
            f"link add {slot.host_ifname} address {host_mac(index)} type veth"
            f" peer name {slot.guest_ifname} address {GUEST_MAC} netns {slot.netns}",
            # No IPv6 link-local address: sandboxes have no IPv6 and the host veth needs none.
            f"link set {slot.host_ifname} addrgenmode none",
            f"addr add {GATEWAY_IP}/{PREFIX_LEN} dev {slot.host_ifname}",
            f"link set {slot.host_ifname} up",
            f"route add {return_ip}/32 via {GUEST_IP} dev {slot.host_ifname}",
            # Each side's one neighbour is known: written as permanent, it is never resolved
            # nor collected, and does not count against the kernel's neighbour table, which
            # is one for every namespace (gc_thresh3, 1,024 here): at ~500 slots with learned
            # entries on both sides the table overflowed and new sandboxes went unreachable.
            f"neigh replace {GUEST_IP} lladdr {GUEST_MAC} dev {slot.host_ifname} nud permanent",
        ]
    )
    guest_side = "\n".join(
        [
            f"link set {slot.guest_ifname} addrgenmode none",
            f"addr add {GUEST_IP}/{PREFIX_LEN} dev {slot.guest_ifname}",
            f"link set {slot.guest_ifname} up",
            "link set lo up",
            f"route add default via {GATEWAY_IP} dev {slot.guest_ifname}",
            f"neigh replace {GATEWAY_IP} lladdr {host_mac(index)} dev {slot.guest_ifname}"
            " nud permanent",
        ]
    )

    try:
        await _ip(["ip", "-batch", "-"], host_side)
        await _ip(["ip", "-n", slot.netns, "-batch", "-"], guest_side)
        _write_sysctl(PROC_SYS / "ipv6" / "conf" / slot.host_ifname / "disable_ipv6", "1")
    except BaseException:
        try:
            await destroy(index)
        except Exception:
            log.exception("could not remove half-created slot %d", index)
        raise
    return slot


async def destroy(index: int) -> None:
    """Remove slot ``index``: host veth (which takes its peer and the return route) and netns.

    Prerequisites: no sandbox uses the slot any more.
    On success: no netns, veth or route of the slot is left. Idempotent: parts already gone
    are skipped.
    On failure: raises ``Internal``; parts may remain for the sweeper.
    """
    check_index(index)
    # Another process (a node shutting down, a person) may remove a part between our look and
    # ``ip``'s ("Cannot remove namespace file …: No such file", "Cannot find device"): what is
    # gone is removed, so a failure only counts if a part is still there afterwards.
    for attempt in range(2):
        commands = []
        # Delete the veth explicitly: a netns is torn down asynchronously by the kernel, and a
        # veth still in it would make a new slot with the same index fail with "File exists".
        if (SYS_NET / host_ifname(index)).exists():
            commands.append(f"link del {host_ifname(index)}")
        if (NETNS_DIR / netns_name(index)).exists():
            commands.append(f"netns del {netns_name(index)}")
        if not commands:
            return
        try:
            # -force: go on after a failed line, so the netns goes even if the veth did not.
            await _ip(["ip", "-force", "-batch", "-"], "\n".join(commands))
            return
        except Internal:
            if not exists(index):
                return
            if attempt:
                raise


def ensure_forwarding() -> None:
    """Turn on IPv4 forwarding, without which sandboxes have no egress (as Docker does).

    Prerequisites: root.
    On success: ``net.ipv4.ip_forward`` is 1. A strict ``rp_filter`` on ``all`` is logged: it
    drops replies from every slot but the first, because all slots share the guest address.
    On failure: raises ``Internal``.
    """
    path = PROC_SYS / "ipv4" / "ip_forward"
    if path.read_text().strip() != "1":
        log.warning("enabling net.ipv4.ip_forward for sandbox egress")
        _write_sysctl(path, "1")
    if (PROC_SYS / "ipv4" / "conf" / "all" / "rp_filter").read_text().strip() == "1":
        log.warning(
            "net.ipv4.conf.all.rp_filter=1 (strict) drops guest traffic of all slots but one; "
            "set it to 0 or 2"
        )


def reserve_ports(ports: Iterable[int]) -> None:
    """Keep ``ports`` out of the kernel's ephemeral range (``ip_local_reserved_ports``).

    The egress proxy listens on fixed ports inside that range, bound to each slot's veth; an
    outgoing connection of the host that happened to get one of them as its local port made
    every proxy listener of that port fail with ``EADDRINUSE`` (a create with a domain rule
    answered 500) for as long as that connection lived.
    Prerequisites: root. On success: each port is in the reserved list (others kept).
    On failure: raises ``Internal``.
    """
    path = PROC_SYS / "ipv4" / "ip_local_reserved_ports"
    listed = path.read_text().strip()
    reserved: set[int] = set()
    for part in filter(None, listed.split(",")):
        low, _, high = part.partition("-")
        reserved.update(range(int(low), int(high or low) + 1))
    missing = sorted(set(ports) - reserved)
    if missing:
        log.info("reserving ports %s for the egress proxy (net.ipv4.ip_local_reserved_ports)",
                 ", ".join(map(str, missing)))
        _write_sysctl(path, ",".join(filter(None, [listed, *map(str, missing)])))


async def ensure_tunnel_routing(mark: int, table: int) -> None:
    """Deliver packets marked ``mark`` locally (the TPROXY of a slot's TCP to the egress
    proxy's tunnel listener, nft.py): an ``ip rule`` to routing table ``table`` and its one
    ``local`` route. Idempotent; both are left in place at exit (harmless: nothing else sets
    the mark).

    On failure: raises ``Internal``.
    """
    rules = await proc.run(["ip", "-4", "rule", "show", "fwmark", hex(mark)],
                           timeout=IP_TIMEOUT_S, check=False)
    if f"lookup {table}" not in rules.text:
        await _ip(["ip", "-4", "-batch", "-"],
                  f"rule add fwmark {hex(mark)} lookup {table} priority 100")
    await _ip(["ip", "-4", "-batch", "-"], f"route replace local 0.0.0.0/0 dev lo table {table}")


def _write_sysctl(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise Internal(f"cannot set {path}: {exc}") from exc


async def _ip(argv: list[str], script: str) -> None:
    try:
        await proc.run(argv, input=(script + "\n").encode(), timeout=IP_TIMEOUT_S)
    except CommandError as exc:
        raise Internal(f"network slot setup failed: {exc.stderr.strip() or exc}") from exc
