"""A late release of a network slot must not destroy the slot's next lease (no machine state:
the pool's own bookkeeping, with its destroy step recorded instead of run)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aenv.network import slots
from aenv.network.pool import NetConfig, SlotPool

pytestmark = pytest.mark.anyio


class RecordingPool(SlotPool):
    def __init__(self) -> None:
        super().__init__(NetConfig(first_index=64_000, last_index=64_009))
        self.destroyed: list[int] = []

    async def _destroy(self, index: int) -> None:
        self.destroyed.append(index)


async def test_a_stale_release_leaves_the_current_lease_alone() -> None:
    pool = RecordingPool()
    old = replace(slots.slot_for(64_001), lease="first")
    pool._leased[old.index] = replace(old, lease="second")  # freed, then leased again
    await pool.release(old)
    assert pool.destroyed == []
    await pool.release(replace(old, lease="second"))
    assert pool.destroyed == [old.index]


async def test_a_stale_release_leaves_a_ready_slot_alone() -> None:
    pool = RecordingPool()
    old = replace(slots.slot_for(64_002), lease="first")
    pool._ready.append(slots.slot_for(64_002))  # freed and made again, not yet handed out
    await pool.release(old)
    assert pool.destroyed == []


async def test_release_after_a_restart_destroys_the_slot() -> None:
    pool = RecordingPool()  # knows no lease: the slot is a previous run's
    await pool.release(replace(slots.slot_for(64_003), lease="from-the-store"))
    assert pool.destroyed == [64_003]
