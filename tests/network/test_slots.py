"""Slots and the pool on the real kernel: netns, veths, routes, nft entries, sweeping."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from aenv.core.errors import Internal
from aenv.core.net import GATEWAY_IP, GUEST_IP, GUEST_MAC, EgressPolicy
from aenv.network import nft, slots
from aenv.network import pool as pool_module
from aenv.network.pool import SlotPool
from tests.network.fixtures import TEST_FIRST, TEST_LAST, ours, pool_config, shut
from tests.network.peers import wait_gone

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]


def _ip_json(*argv: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-j", *argv], check=True, capture_output=True, text=True)
    data: list[dict[str, object]] = json.loads(out.stdout or "[]")
    return data


async def test_a_slot_has_the_shared_addresses_and_its_own_route(pool: SlotPool) -> None:
    slot = await pool.acquire()
    guest = _ip_json("-n", slot.netns, "addr", "show", "eth0")[0]
    assert guest["address"] == GUEST_MAC
    assert [a["local"] for a in guest["addr_info"]] == [GUEST_IP]  # type: ignore[index,union-attr]
    assert _ip_json("-n", slot.netns, "route", "show", "default")[0]["gateway"] == GATEWAY_IP
    host = _ip_json("addr", "show", slot.host_ifname)[0]
    assert host["address"] == slots.host_mac(slot.index)
    assert [a["local"] for a in host["addr_info"]] == [GATEWAY_IP]  # type: ignore[index,union-attr]
    route = _ip_json("route", "show", pool.return_ip(slot))[0]
    assert route["dev"] == slot.host_ifname and route["gateway"] == GUEST_IP
    table = await nft.read_table()
    assert table is not None and table.slots[slot.index] == slot.host_ifname
    # Each side's neighbour is written, permanent (the kernel's one table holds no learned
    # entries of slots, which overflowed it at ~500 sandboxes).
    [guest_neigh] = _ip_json("-n", slot.netns, "neigh", "show", "dev", "eth0")
    assert guest_neigh["dst"] == GATEWAY_IP and guest_neigh["lladdr"] == host["address"]
    assert guest_neigh["state"] == ["PERMANENT"]
    [host_neigh] = _ip_json("neigh", "show", "dev", slot.host_ifname)
    assert host_neigh["dst"] == GUEST_IP and host_neigh["lladdr"] == GUEST_MAC
    assert host_neigh["state"] == ["PERMANENT"]

    await pool.release(slot)
    assert not Path(f"/sys/class/net/{slot.host_ifname}").exists()
    assert wait_gone(Path(slot.netns_path))
    table = await nft.read_table()
    assert table is not None and slot.index not in set(table.slots) | table.chains
    await pool.release(slot)  # idempotent


async def test_slot_setup_time(pool: SlotPool) -> None:
    """Measured: one slot made on demand (netns, veth, routes, nft entries)."""
    create, release = [], []
    for _ in range(10):
        started = time.perf_counter()
        slot = await pool.acquire()
        create.append(time.perf_counter() - started)
        started = time.perf_counter()
        await pool.release(slot)
        release.append(time.perf_counter() - started)
    print(
        f"\nslot create p50 {statistics.median(create) * 1000:.1f} ms "
        f"(min {min(create) * 1000:.1f}), release p50 {statistics.median(release) * 1000:.1f} ms"
    )
    assert statistics.median(create) < 1.0


async def test_the_pool_keeps_slots_ready() -> None:
    pool = SlotPool(pool_config(low=2, high=3))
    await pool.start()
    try:
        await _until(lambda: pool.ready_count == 3)
        started = time.perf_counter()
        await pool.acquire()
        took = time.perf_counter() - started
        assert took < 0.05, f"a ready slot took {took * 1000:.1f} ms"
        assert pool.ready_count == 2  # not below low: no refill yet
        await pool.acquire()
        await _until(lambda: pool.ready_count == 3)  # below low: refilled up to high
    finally:
        await shut(pool)
    assert ours() == set()


async def test_a_policy_given_at_acquire_is_in_the_slot_chain(pool: SlotPool) -> None:
    slot = await pool.acquire(EgressPolicy(allow_internet=False, allow_out=("10.9.0.0/16",)))
    rules = _chain_rules(slot.index)
    assert "ip daddr 10.9.0.0/16 accept" in rules and rules[-1] == "drop"
    await pool.set_egress(slot, EgressPolicy())
    assert _chain_rules(slot.index)[-1] == "accept"


async def test_sweep_removes_unknown_slots_of_its_range_only() -> None:
    """Crash recovery: leftovers in the pool's range go, others' slots stay."""
    own = SlotPool(pool_config(first_index=TEST_FIRST, last_index=TEST_FIRST + 499))
    other = SlotPool(pool_config(first_index=TEST_FIRST + 500, last_index=TEST_LAST))
    await other.start()
    foreign = await other.acquire()
    try:
        # A slot of a crashed server: on the machine, in the table, known to no pool.
        leftover = slots.slot_for(TEST_FIRST + 400)
        return_ip = slots.return_address(leftover.index, own.config.return_net)
        await slots.create(leftover.index, return_ip=return_ip)
        entry = nft.SlotEntry(leftover.index, leftover.host_ifname, return_ip)
        await nft.apply(nft.add_slot_script(entry, EgressPolicy()))

        await own.start()
        assert await own.sweep() == [leftover.index]
        assert not slots.exists(leftover.index) or wait_gone(Path(leftover.netns_path))
        assert slots.exists(foreign.index)
        table = await nft.read_table()
        assert table is not None and leftover.index not in table.slots
        assert foreign.index in table.slots
    finally:
        await own.close()
        await other.release(foreign)
        await other.close()
    assert ours() == set()


async def test_sweep_and_refill_at_start_keep_every_ready_slot_whole() -> None:
    """Start-up of a node whose range has leftovers with nft entries but no netns (a killed
    node whose netns were deleted by hand): the refill runs while sweep removes them, and
    no slot it made may lose its netns to the sweep."""
    first = TEST_FIRST + 600
    config = pool_config(first_index=first, last_index=first + 99, low=2, high=4)
    leftovers = list(range(first, first + 12))
    for index in leftovers:
        entry = nft.SlotEntry(index, slots.host_ifname(index),
                              slots.return_address(index, config.return_net))
        await nft.apply(nft.add_slot_script(entry, EgressPolicy()))
    pool = SlotPool(config)
    await pool.start()
    try:
        swept = await pool.sweep()
        await _until(lambda: pool.ready_count == 4)
        taken = [await pool.acquire() for _ in range(4)]
        broken = [s.index for s in taken if not slots.whole(s.index)]
        assert broken == [], f"ready slots without their netns or veth: {broken}"
        assert set(swept) == set(leftovers)
        table = await nft.read_table()
        assert table is not None
        assert {i for i in leftovers if i in table.slots or i in table.chains} == set()
    finally:
        await shut(pool)
    assert ours() == set()


async def test_adopt_after_a_restart_keeps_the_slot_and_its_policy() -> None:
    first = SlotPool(pool_config())
    await first.start()
    slot = await first.acquire(EgressPolicy(allow_internet=False))
    await first.close()  # the server stops; the sandbox (and its slot) lives on
    assert slots.exists(slot.index)

    second = SlotPool(pool_config())
    await second.start()
    try:
        await second.adopt(slot)
        assert await second.sweep() == []
        assert _chain_rules(slot.index) == ["drop"]
    finally:
        await second.release(slot)
        await second.close()
    assert ours() == set()


def _chain_rules(index: int) -> list[str]:
    out = subprocess.run(
        ["nft", "list", "chain", "inet", "aenv", nft.chain_of(index)],
        check=True, capture_output=True, text=True,
    ).stdout
    body = out.split("{", 2)[2].rsplit("}", 2)[0]
    return [line.strip() for line in body.splitlines() if line.strip()]


async def _until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)



async def test_a_slot_whose_teardown_failed_is_removed_on_a_later_try(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown refused once (a netns still busy) is not left to the next start's sweep:
    the refill task tries again, and the index serves sandboxes again."""
    monkeypatch.setattr(pool_module, "RETRY_UNDONE_S", 0.2)
    pool = SlotPool(pool_config(low=1, high=2))
    await pool.start()
    await pool.sweep()  # what earlier tests left in the range
    real_destroy = slots.destroy
    refused: list[int] = []

    async def refuse_once(index: int) -> None:
        if not refused:
            refused.append(index)
            raise Internal(f"netns aenv-{index} is busy (refused by the test)")
        await real_destroy(index)

    try:
        slot = await pool.acquire()
        monkeypatch.setattr(slots, "destroy", refuse_once)
        with pytest.raises(Internal):
            await pool.release(slot)
        assert refused == [slot.index] and slots.exists(slot.index)
        await _until(lambda: not slots.exists(slot.index), timeout=5)
        assert slot.index not in await pool.sweep()  # nothing left for a sweep to find
    finally:
        await shut(pool)
    assert ours() == set()


async def test_a_pool_closed_while_it_refills_leaves_nothing_behind() -> None:
    """A node that stops while its pool makes slots: the slot being made is finished and
    removed, or never made — no netns, veth or nft entry is left at any point of the making."""
    first = TEST_FIRST + 800
    for delay in (0.0, 0.003, 0.01, 0.02, 0.04, 0.08, 0.16):
        pool = SlotPool(pool_config(first_index=first, last_index=first + 99, low=6, high=6))
        await pool.start()
        await asyncio.sleep(delay)
        await pool.close()
        table = await nft.read_table()
        assert table is not None
        left = {i for i in (*table.slots, *table.chains, *slots.existing())
                if first <= i <= first + 99}
        assert left == set(), f"closed {delay} s into its refill, it left slots {left}"
