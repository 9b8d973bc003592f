"""A pool of prepared network slots, so creating a sandbox does not pay for slot setup.

The pool keeps between ``low`` and ``high`` slots ready (netns, veth, routes and nft entries
with the default egress policy), refilled by one background task it owns. A second task keeps
the table's ``node_nets`` set (node_nets.py) current: read at start, before any slot is handed
out, then every ``node_nets_refresh_s`` (a LAN, VPN or bridge that comes up later is denied
within that time). A slot is used by
one sandbox and then destroyed: runsc moves the guest address into its netstack, so a used
netns is not worth recycling, and a fresh one carries no state of the previous sandbox.

Indices cycle through ``first_index..last_index`` instead of restarting at the lowest free one,
so a slot's conntrack zone is not reused while the previous owner's entries may linger.

Recovery after a restart: ``start()`` (table, forwarding, refill) → the orchestrator
``adopt()``s the slots of sandboxes it re-attached → ``sweep()`` removes every other slot in the
pool's index range (netns, veth, nft entries) left by a crash.

Owns: slots in its index range, through slots.py and nft.py. Must not touch: slots outside
its range (another node process or a test may own them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from dataclasses import dataclass, field, replace

from aenv.core.errors import AenvError, Internal, InvalidArgument, NotFound, ResourceExhausted
from aenv.core.keyed_locks import KeyedLocks
from aenv.core.net import EgressPolicy, NetSlot
from aenv.core.unwind import to_the_end
from aenv.network import nft, node_nets, slots
from aenv.network.egress_dns import Resolver
from aenv.network.egress_proxy import EgressProxy

log = logging.getLogger("aenv.network")

#: After a failed refill, wait this long before the next attempt (doubling up to the max), so a
#: broken host (no nft, RTNL stuck) is not hammered.
REFILL_BACKOFF_S = 0.5
REFILL_BACKOFF_MAX_S = 30.0
#: How often a slot whose teardown failed is tried again.
RETRY_UNDONE_S = 5.0
#: Every this many refreshes the set is written even when unchanged: another process (a test
#: session, another aenv version) may have recreated the table with the set empty.
NODE_NETS_REWRITE_EVERY = 12


@dataclass(frozen=True)
class NetConfig:
    """Node-level network settings (the integrator maps them from ``Settings``)."""

    #: Refill when fewer slots than this are ready.
    low: int = 2
    #: Refill up to this many ready slots.
    high: int = 4
    #: Slot indices this pool may use (conntrack zones: at most 1..65535). Disjoint ranges let
    #: several pools (a test suite next to a node) share one machine.
    first_index: int = 1
    last_index: int = 60_000
    #: Return addresses of slots (see nft.py); must hold ``last_index + 1`` addresses.
    return_net: str = nft.RETURN_NET
    #: Ranges a sandbox may only reach when its policy's ``allow_out`` names them.
    internal: tuple[str, ...] = nft.INTERNAL
    #: Egress policy of a slot nobody asked otherwise for.
    default_egress: EgressPolicy = field(default_factory=EgressPolicy)
    #: How often the node's own networks are read again (node_nets.py).
    node_nets_refresh_s: float = 5.0
    #: DNS servers the egress proxy resolves names with (egress_proxy.py); empty: the
    #: host's resolv.conf.
    resolvers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise InvalidArgument("need 0 <= low <= high for the slot pool")
        if self.node_nets_refresh_s <= 0:
            raise InvalidArgument("node_nets_refresh_s must be positive")
        if not slots.MIN_INDEX <= self.first_index <= self.last_index <= slots.MAX_INDEX:
            raise InvalidArgument(f"slot indices must lie in {slots.MIN_INDEX}..{slots.MAX_INDEX}")
        slots.return_address(self.last_index, self.return_net)  # raises if it does not fit


class SlotPool:
    """Prepared slots for sandboxes; see the module docstring for the lifecycle."""

    def __init__(self, config: NetConfig | None = None) -> None:
        self.config = config or NetConfig()
        self._ruleset = nft.render_table(
            return_net=self.config.return_net, internal=self.config.internal
        )
        self._ready: deque[NetSlot] = deque()
        self._leased: dict[int, NetSlot] = {}
        #: Indices being created by this pool right now.
        self._creating: set[int] = set()
        #: Indices found on the machine at start, or whose teardown failed: not handed out
        #: until ``sweep`` removed them.
        self._blocked: set[int] = set()
        #: Indices whose teardown failed while this pool ran (a netns still busy, RTNL
        #: refusing): retried every ``RETRY_UNDONE_S`` by the refill task, not left blocked
        #: until the next start's sweep.
        self._undone: set[int] = set()
        #: One change at a time per leased slot: an egress update and the release racing
        #: it (the sandbox killed during its create) wrote the policy's chain back after the
        #: release removed it, a leftover no pool owned.
        self._changing = KeyedLocks()
        self._next_index = self.config.first_index
        self._wake = asyncio.Event()
        self._refill_task: asyncio.Task[None] | None = None
        self._node_nets_task: asyncio.Task[None] | None = None
        #: What this pool last wrote into ``node_nets`` (None: nothing yet).
        self._node_nets: tuple[node_nets.Network, ...] | None = None
        self._table_fresh = False
        #: Domain rules (HTTP Host, TLS SNI, DNS) of the slots whose policy names domains.
        self.proxy = EgressProxy(
            Resolver(self.config.resolvers), never=nft.NEVER, internal=self.config.internal,
            node_nets=lambda: [str(n) for n in self._node_nets or ()])

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Prepare the host and start refilling.

        Prerequisites: root; ``ip`` and ``nft`` installed.
        On success: IPv4 forwarding is on, the egress proxy's ports are reserved, the nft
        table exists and is current, its ``node_nets`` set holds the node's networks, the
        refill task runs and fills the pool up to ``high``, the refresh task keeps
        ``node_nets`` current. Slots already on the machine are left alone (``adopt`` or
        ``sweep`` them next).
        On failure: raises ``Internal``; nothing runs.
        """
        slots.ensure_forwarding()
        slots.reserve_ports((nft.PROXY_HTTP_PORT, nft.PROXY_TLS_PORT, nft.PROXY_DNS_PORT,
                             nft.PROXY_TUNNEL_PORT))
        await slots.ensure_tunnel_routing(nft.TUNNEL_MARK, nft.TUNNEL_TABLE)
        self._table_fresh = await nft.ensure_table(self._ruleset)
        await self.refresh_node_nets(force=True)
        # Leftovers are blocked before the refill starts, table-only ones (a netns deleted by
        # hand, its nft entries kept) included: a refill that took one would lose it to sweep.
        self._blocked |= {i for i in await self._found() if self._in_range(i)}
        if self._refill_task is None:
            self._refill_task = asyncio.create_task(self._refill_loop(), name="aenv-slot-refill")
        if self._node_nets_task is None:
            self._node_nets_task = asyncio.create_task(
                self._node_nets_loop(), name="aenv-node-nets"
            )
        self._wake.set()

    async def close(self) -> None:
        """Stop refilling and destroy the ready (unused) slots.

        Leased slots stay: their sandboxes outlive the server process and are adopted by the
        next one.
        """
        await self.proxy.close()
        tasks = [t for t in (self._refill_task, self._node_nets_task) if t is not None]
        self._refill_task = self._node_nets_task = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ready, self._ready = list(self._ready), deque()
        # At once, as concurrent releases do: one after another took ~1 s at every stop.
        await asyncio.gather(*(self._destroy_ready(slot.index) for slot in ready))

    async def _destroy_ready(self, index: int) -> None:
        try:
            await self._destroy(index)
        except AenvError as exc:
            log.warning("could not remove ready slot %d: %s", index, exc.message)

    # ---------------------------------------------------------------- slots for sandboxes

    async def acquire(self, policy: EgressPolicy | None = None) -> NetSlot:
        """A slot for one new sandbox, with ``policy`` (default: the pool's default policy).

        Prerequisites: ``start()`` was called.
        On success: the slot is leased until ``release``. A ready one is taken when there is
        one (no process, or one nft call for a non-default policy), else one is made (~20 ms).
        On failure: raises ``ResourceExhausted`` when every index is in use, ``Internal`` when
        the host refuses, ``InvalidArgument`` for a bad policy; nothing stays leased.
        """
        slot = self._ready.popleft() if self._ready else None
        if len(self._ready) < self.config.low:
            self._wake.set()
        if slot is None:
            slot = await self._create()
        slot = replace(slot, lease=secrets.token_hex(8))
        self._leased[slot.index] = slot
        try:
            if policy is not None and policy != self.config.default_egress:
                await self._apply(nft.policy_script(slot.index, policy))
                await self.proxy.apply(slot, policy)
        except BaseException:
            await asyncio.shield(self.release(slot))
            raise
        return slot

    async def release(self, slot: NetSlot) -> None:
        """Destroy a slot whose sandbox is gone. Idempotent.

        Prerequisites: no sandbox runs in the slot any more.
        On success: its netns, veth, route and nft entries are gone and the index is free.
        On failure: raises ``Internal``; the index stays out of use until ``sweep``.
        """
        async with self._changing.hold(str(slot.index)):
            current = self._leased.get(slot.index)
            if (current is not None and current.lease != slot.lease) or any(
                ready.index == slot.index for ready in self._ready
            ):
                # Released before and made again for someone else: this release is stale.
                log.warning("ignored a stale release of slot %d", slot.index)
                return
            self._leased.pop(slot.index, None)
            self.proxy.detach(slot.index)
            await self._destroy(slot.index)

    async def adopt(self, slot: NetSlot, policy: EgressPolicy | None = None) -> None:
        """Take over the slot of a sandbox that survived a server restart.

        Prerequisites: ``start()`` was called; the slot exists on the machine.
        On success: the slot is leased and its nft entries exist. Its egress rules are kept;
        ``policy`` replaces them when given. If the table had to be recreated (another aenv
        version wrote it) and no policy is given, the default policy is applied and logged.
        On failure: raises ``NotFound`` when the slot is not on the machine, or only part of it
        (its netns or its host veth was removed), ``Internal`` when nft fails.
        """
        slots.check_index(slot.index)
        if not slots.whole(slot.index):
            missing = "is not" if not slots.exists(slot.index) else "is only partly"
            raise NotFound(f"network slot {slot.index} {missing} on this machine")
        if policy is None and self._table_fresh:
            log.warning("slot %d adopted into a recreated nft table: default egress", slot.index)
            policy = self.config.default_egress
        await self._apply(nft.add_slot_script(self._entry(slot.index), policy))
        if policy is not None:
            await self.proxy.apply(slot, policy)
        self._blocked.discard(slot.index)
        self._leased[slot.index] = slot

    def egress_ca(self) -> str | None:
        interception = self.proxy.interception
        return interception.ca_pem if interception is not None else None

    async def set_egress(self, slot: NetSlot, policy: EgressPolicy) -> None:
        """Replace a leased slot's egress policy; it applies from the next packet on, open
        connections included.

        On failure: raises ``InvalidArgument`` (not leased, bad CIDR) or ``Internal``; the old
        rules stay.
        """
        async with self._changing.hold(str(slot.index)):
            if slot.index not in self._leased:
                raise InvalidArgument(
                    f"network slot {slot.index} is not leased from this pool")
            # The proxy first: a slot newly intercepted finds its listeners there.
            await self.proxy.apply(slot, policy)
            await self._apply(nft.policy_script(slot.index, policy))

    async def sweep(self) -> list[int]:
        """Remove every slot in this pool's index range that is neither ready nor leased.

        Prerequisites: every surviving sandbox's slot was ``adopt``ed.
        On success: returns the indices removed (netns, veth, nft entries).
        On failure: raises ``Internal`` after trying every index; the rest stay for next time.
        """
        found = await self._found()
        # No await from here to the loop: a slot the refill made meanwhile is in keep, and
        # blocking every stale index first keeps the refill off those the loop has not reached.
        keep = {s.index for s in self._ready} | set(self._leased) | self._creating
        stale = sorted(i for i in found | self._blocked if self._in_range(i) and i not in keep)
        self._blocked |= set(stale)
        failed: list[str] = []
        for index in stale:
            try:
                await self._destroy(index)
            except AenvError as exc:
                failed.append(f"{index}: {exc.message}")
        if stale:
            log.info("swept %d leftover network slots", len(stale) - len(failed))
        if failed:
            raise Internal("could not sweep network slots " + "; ".join(failed))
        return stale

    async def refresh_node_nets(self, *, force: bool = False) -> tuple[node_nets.Network, ...]:
        """Read the node's networks and write them into the table's ``node_nets`` set.

        On success: returns the networks; the set holds them (written only when they changed
        since this pool's last write, or ``force``).
        On failure: raises ``Internal``; the set keeps what it held (fail closed: networks the
        node no longer has stay denied).
        """
        nets = await node_nets.read()
        if force or nets != self._node_nets:
            await self._apply(nft.node_nets_script(nets))
            if nets != self._node_nets:
                log.info("node networks denied to sandboxes: %s",
                         ", ".join(str(n) for n in nets) or "none")
            self._node_nets = nets
        return nets

    # ---------------------------------------------------------------- introspection

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def leased(self) -> list[NetSlot]:
        return list(self._leased.values())

    def return_ip(self, slot: NetSlot) -> str:
        """The slot's return address (host-internal; see nft.py)."""
        return slots.return_address(slot.index, self.config.return_net)

    # ---------------------------------------------------------------- internals

    async def _found(self) -> set[int]:
        """Indices with any part on the machine: a netns, a host veth or nft entries."""
        found = slots.existing()
        table = await nft.read_table()
        if table is not None:
            found |= set(table.slots) | table.chains
        return found

    def _in_range(self, index: int) -> bool:
        return self.config.first_index <= index <= self.config.last_index

    def _entry(self, index: int) -> nft.SlotEntry:
        return nft.SlotEntry(
            index=index,
            ifname=slots.host_ifname(index),
            return_ip=slots.return_address(index, self.config.return_net),
        )

    def _allocate_index(self) -> int:
        """The next free index after the last one handed out (synchronous, so no race)."""
        first, last = self.config.first_index, self.config.last_index
        span = last - first + 1
        taken = self._creating | self._blocked | set(self._leased)
        taken |= {s.index for s in self._ready}
        for step in range(span):
            index = first + (self._next_index - first + step) % span
            # exists(): another process (a test session, a second node) may own the index.
            if index not in taken and not slots.exists(index):
                self._next_index = first + (index - first + 1) % span
                self._creating.add(index)
                return index
        raise ResourceExhausted(f"all {span} network slots of this node are in use")

    async def _create(self) -> NetSlot:
        index = self._allocate_index()
        try:
            # Whole or not at all, cancelled or not: the refill cancelled by ``close`` mid-way
            # left a slot's nft entries that no pool owned (the next test's sweep found them).
            making = asyncio.ensure_future(self._make(index))
            try:
                return await to_the_end(making)
            except asyncio.CancelledError:
                if making.done() and not making.cancelled() and making.exception() is None:
                    await to_the_end(self._destroy(index))  # made, but nobody will take it
                raise
        finally:
            self._creating.discard(index)

    async def _make(self, index: int) -> NetSlot:
        entry = self._entry(index)
        slot = await slots.create(index, return_ip=entry.return_ip)  # removes its own half
        try:
            await self._apply(nft.add_slot_script(entry, self.config.default_egress))
        except BaseException:
            # The nft entries too: an ``nft`` killed by a cancel may have committed them.
            await self._destroy(index)
            raise
        return slot

    async def _apply(self, script: str) -> None:
        try:
            await nft.apply(script)
        except Internal:
            # Someone removed the table (a test session tearing down next to us): recreate it
            # once and retry. Other slots' entries went with it; adopt() restores them.
            if await nft.read_table() is not None:
                raise
            self._table_fresh = await nft.ensure_table(self._ruleset)
            if self._node_nets is not None:
                # The new table's set is empty: fill it in the same breath, not a refresh later.
                await nft.apply(nft.node_nets_script(self._node_nets))
            await nft.apply(script)

    async def _destroy(self, index: int) -> None:
        self._blocked.add(index)
        try:
            try:
                await nft.apply(nft.remove_slot_script(self._entry(index)))
            except Internal:
                if await nft.read_table() is not None:
                    raise  # a real failure; without a table there is nothing to remove
            await slots.destroy(index)
        except Exception:
            self._undone.add(index)
            self._wake.set()  # the refill task, waiting, now waits with a retry time
            raise
        self._undone.discard(index)
        self._blocked.discard(index)

    async def _retry_undone(self) -> None:
        for index in sorted(self._undone):
            try:
                await self._destroy(index)
                log.info("removed network slot %d on a later try", index)
            except AenvError as exc:
                log.warning("network slot %d still cannot be removed: %s", index, exc.message)

    async def _refill_loop(self) -> None:
        backoff = REFILL_BACKOFF_S
        while True:
            if self._undone:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_UNDONE_S):
                        await self._wake.wait()
                await self._retry_undone()
            else:
                await self._wake.wait()
            self._wake.clear()
            while len(self._ready) < self.config.high:
                try:
                    self._ready.append(await self._create())
                    backoff = REFILL_BACKOFF_S
                except Exception as exc:
                    # Keep the loop alive: acquire() still works (it creates on demand) and
                    # the next attempt may succeed once the host recovers.
                    log.warning("could not prepare a network slot: %s", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, REFILL_BACKOFF_MAX_S)

    async def _node_nets_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self.config.node_nets_refresh_s)
            ticks += 1
            try:
                await self.refresh_node_nets(force=ticks % NODE_NETS_REWRITE_EVERY == 0)
            except Exception as exc:
                log.warning("could not refresh the node's networks: %s", exc)
