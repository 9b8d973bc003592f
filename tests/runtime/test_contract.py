"""The driver contract (runtime.base.Runtime), run against the fake and the real gVisor driver.

What the orchestrator relies on: boot → observe shows it; a live id cannot boot twice; bad specs
and failed boots leave nothing; destroy is idempotent and frees the id.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Protocol

import pytest

from aenv.core import ids
from aenv.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    RuntimeFailure,
)
from aenv.network import slots
from aenv.network.base import NetSlot
from aenv.runtime.base import Instance, Runtime, SandboxSpec
from aenv.runtime.fake import FakeRuntime
from tests.runtime.conftest import SandboxFactory

pytestmark = pytest.mark.anyio

_fake_slots = itertools.count(61_900)


class Harness(Protocol):
    runtime: Runtime

    def spec(self) -> SandboxSpec: ...

    async def slot(self) -> NetSlot: ...

    async def give_back(self, slot: NetSlot) -> None: ...

    def track(self, instance: Instance, spec: SandboxSpec) -> None: ...

    def broken_slot(self, slot: NetSlot, tmp: Path) -> NetSlot: ...

    def make_next_boot_fail(self) -> None: ...


class FakeHarness:
    def __init__(self, tmp: Path) -> None:
        self.runtime = FakeRuntime()
        self.tmp = tmp

    def spec(self) -> SandboxSpec:
        sid = ids.new_sandbox_id()
        rootfs = self.tmp / sid
        rootfs.mkdir()
        return SandboxSpec(sid, rootfs, self.tmp, cpu_count=1, memory_mb=256)

    async def slot(self) -> NetSlot:
        return slots.slot_for(next(_fake_slots))

    async def give_back(self, slot: NetSlot) -> None:
        pass

    def track(self, instance: Instance, spec: SandboxSpec) -> None:
        pass

    def broken_slot(self, slot: NetSlot, tmp: Path) -> NetSlot:
        return slot

    def make_next_boot_fail(self) -> None:
        self.runtime.fail_next_boot(RuntimeFailure("boot failed (injected)"))


class GvisorHarness:
    def __init__(self, factory: SandboxFactory) -> None:
        self.factory = factory
        self.runtime = factory.runtime

    def spec(self) -> SandboxSpec:
        return self.factory.spec()

    async def slot(self) -> NetSlot:
        return await self.factory.pool.acquire()

    async def give_back(self, slot: NetSlot) -> None:
        await self.factory.pool.release(slot)

    def track(self, instance: Instance, spec: SandboxSpec) -> None:
        self.factory.track(instance, spec)

    def broken_slot(self, slot: NetSlot, tmp: Path) -> NetSlot:
        # A path that exists but is no network namespace: runsc itself fails.
        (tmp / "not-a-netns").write_text("")
        return dataclasses.replace(slot, netns_path=str(tmp / "not-a-netns"))

    def make_next_boot_fail(self) -> None:
        raise NotImplementedError  # the real driver fails for real (broken_slot)


@pytest.fixture(params=["fake", pytest.param("gvisor", marks=[pytest.mark.gvisor,
                                                              pytest.mark.slow])])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # Sync on purpose: an async fixture cannot pull in another async fixture on demand.
    if request.param == "fake":
        return FakeHarness(tmp_path)
    factory: SandboxFactory = request.getfixturevalue("sandboxes")
    return GvisorHarness(factory)


async def _boot(h: Harness, spec: SandboxSpec | None = None) -> Instance:
    spec = spec or h.spec()
    slot = await h.slot()
    try:
        instance = await h.runtime.boot(spec, slot)
    except BaseException:
        await h.give_back(slot)
        raise
    h.track(instance, spec)
    return instance


async def test_boot_observe_stats_destroy(harness: Harness) -> None:
    spec = harness.spec()
    instance = await _boot(harness, spec)
    assert instance.sandbox_id == spec.sandbox_id and instance.runtime_id
    observed = [o for o in await harness.runtime.observe() if o.sandbox_id == spec.sandbox_id]
    assert [(o.runtime_id, o.status) for o in observed] == [(instance.runtime_id, "running")]
    stats = await harness.runtime.stats(instance)
    assert stats.cpu_count == spec.cpu_count
    assert stats.mem_total == spec.memory_mb * 1024 * 1024
    await harness.runtime.destroy(instance)
    assert spec.sandbox_id not in {o.sandbox_id for o in await harness.runtime.observe()}
    await harness.runtime.destroy(instance)  # idempotent


async def test_a_running_id_cannot_boot_twice(harness: Harness) -> None:
    spec = harness.spec()
    await _boot(harness, spec)
    with pytest.raises(AlreadyExists):
        await _boot(harness, spec)
    assert [o.status for o in await harness.runtime.observe()
            if o.sandbox_id == spec.sandbox_id] == ["running"]


async def test_bad_specs_are_refused_before_anything_starts(harness: Harness) -> None:
    spec = harness.spec()
    with pytest.raises(InvalidArgument):
        await _boot(harness, dataclasses.replace(spec, sandbox_id="Not-An-Id"))
    with pytest.raises(FailedPrecondition):
        await _boot(harness, dataclasses.replace(spec, rootfs=spec.rootfs / "missing"))
    assert await harness.runtime.observe() == []


async def test_a_failed_boot_leaves_nothing(harness: Harness, tmp_path: Path) -> None:
    spec = harness.spec()
    slot = await harness.slot()
    try:
        if isinstance(harness, FakeHarness):
            harness.make_next_boot_fail()
        with pytest.raises(RuntimeFailure):
            await harness.runtime.boot(spec, harness.broken_slot(slot, tmp_path))
    finally:
        await harness.give_back(slot)
    assert await harness.runtime.observe() == []
    if isinstance(harness, GvisorHarness):
        assert not harness.factory.runtime.bundle_dir(spec.sandbox_id).exists()


async def test_a_destroyed_id_can_boot_again(harness: Harness) -> None:
    spec = harness.spec()
    first = await _boot(harness, spec)
    await harness.runtime.destroy(first)
    second = await _boot(harness, spec)
    observed = [o for o in await harness.runtime.observe() if o.sandbox_id == spec.sandbox_id]
    assert [o.status for o in observed] == ["running"]
    assert second.net.index != first.net.index or isinstance(harness, FakeHarness)
