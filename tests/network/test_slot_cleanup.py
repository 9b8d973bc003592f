"""Destroying a slot is idempotent against other removers: a node still shutting down, a
person with ``ip``. What is already gone counts as removed ("Cannot remove namespace file …:
No such file" stopped a node's start-up sweep before)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from aenv.core.errors import NotFound
from aenv.network import nft, slots
from aenv.network.pool import SlotPool
from tests.network.fixtures import TEST_LAST
from tests.network.peers import wait_gone

pytestmark = [pytest.mark.gvisor, pytest.mark.anyio]

#: The top of the test range: the pool fixture's allocation starts at the bottom.
INDEX = TEST_LAST - 7


async def _fresh(index: int) -> None:
    await slots.destroy(index)
    await slots.create(index, return_ip=slots.return_address(index, nft.RETURN_NET))
    assert slots.exists(index)


def _gone(index: int) -> bool:
    slot = slots.slot_for(index)
    return wait_gone(slots.NETNS_DIR / slot.netns) and wait_gone(slots.SYS_NET / slot.host_ifname)


async def test_two_destroys_racing_both_succeed() -> None:
    """Both look before either runs ``ip``: the second finds veth and netns gone under it."""
    await _fresh(INDEX)
    try:
        await asyncio.gather(slots.destroy(INDEX), slots.destroy(INDEX), slots.destroy(INDEX))
    finally:
        await slots.destroy(INDEX)
    assert _gone(INDEX)


@pytest.mark.parametrize(
    "by_hand",
    [
        ["netns", "del", slots.netns_name(INDEX)],
        ["link", "del", slots.host_ifname(INDEX)],
    ],
    ids=["netns-deleted", "veth-deleted"],
)
async def test_destroy_of_a_slot_half_removed_by_hand(by_hand: list[str]) -> None:
    await _fresh(INDEX)
    try:
        subprocess.run(["ip", *by_hand], check=True)
        await slots.destroy(INDEX)
        await slots.destroy(INDEX)  # and again: nothing left is fine
    finally:
        await slots.destroy(INDEX)
    assert _gone(INDEX)


@pytest.mark.parametrize(
    "by_hand",
    [
        ["netns", "del", slots.netns_name(INDEX)],
        ["link", "del", slots.host_ifname(INDEX)],
    ],
    ids=["netns-deleted", "veth-deleted"],
)
async def test_adopt_refuses_a_slot_half_removed_by_hand(
    pool: SlotPool, by_hand: list[str]
) -> None:
    """Recovery must not re-attach a sandbox to a slot that cannot carry its traffic (or that
    a restore cannot join): it gets ``NotFound`` and tears the sandbox down instead."""
    await _fresh(INDEX)
    try:
        subprocess.run(["ip", *by_hand], check=True)
        with pytest.raises(NotFound, match="only partly"):
            await pool.adopt(slots.slot_for(INDEX))
        assert pool.leased() == []
    finally:
        await slots.destroy(INDEX)
    assert _gone(INDEX)
