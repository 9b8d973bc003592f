"""Fixtures shared by network and runtime tests (imported by both conftests).

Tests use slot indices 61000-61999 only, so they never touch a node's slots (1-60000) and a
node's sweeper never touches theirs. Every fixture removes what it made, on failure too, and
checks that nothing of its range is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from aenv.network import nft, slots
from aenv.network.pool import NetConfig, SlotPool
from tests.network.peers import InternetPeer, LanPeer

TEST_FIRST = 61_000
TEST_LAST = 61_999


def pool_config(**overrides: Any) -> NetConfig:
    """Test-range pool settings; no background refill unless a test asks for it."""
    values: dict[str, Any] = {
        "low": 0, "high": 0, "first_index": TEST_FIRST, "last_index": TEST_LAST,
    }
    values.update(overrides)
    return NetConfig(**values)


def ours() -> set[int]:
    """Slot indices of the test range present on the machine."""
    return {i for i in slots.existing() if TEST_FIRST <= i <= TEST_LAST}


async def shut(pool: SlotPool) -> None:
    """Release every slot ``pool`` leases, then close it (its ready slots go too)."""
    for slot in pool.leased():
        await pool.release(slot)
    await pool.close()


@pytest.fixture
async def pool() -> AsyncIterator[SlotPool]:
    """A started pool in the test range (no background refill unless a test asks)."""
    pool = SlotPool(pool_config())
    await pool.start()
    try:
        yield pool
    finally:
        await shut(pool)
    assert ours() == set(), "a test left network slots behind"


@pytest.fixture(scope="session")
def internet() -> Iterator[InternetPeer]:
    peer = InternetPeer()
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture(scope="session")
def lan() -> Iterator[LanPeer]:
    """The node's LAN (started before any pool of the test reads the node's networks)."""
    peer = LanPeer()
    peer.start()
    try:
        yield peer
    finally:
        peer.stop()


@pytest.fixture(scope="session", autouse=True)
def nft_table_cleanup() -> Iterator[None]:
    """Remove the nft table at the end if no slot (ours or a node's) is left in it."""
    yield
    table = asyncio.run(nft.read_table())
    if table is not None and not table.slots and not table.chains:
        asyncio.run(nft.delete_table())
