"""The driver contract (runtime.base.Runtime), run against the fake and the real gVisor driver.

What the orchestrator relies on: boot → observe shows it; a live id cannot boot twice; bad specs
and failed boots leave nothing; destroy is idempotent and frees the id; ``wait_exit`` returns
when the runtime ends (checkpoint, destroy) and at once when it is gone. Checkpoint, restore,
freeze and thaw: a checkpoint that leaves the source running yields a complete image that
restores, state and all, under a new id in a new slot; a taken destination or a torn image is
refused without leaving anything; freeze/thaw round-trips; a checkpoint without
``leave_running`` ends the source and restores under its own id (as a resume after a spill).

Where the drivers word a refusal differently (the fake's ``FailedPrecondition``, runsc's
``RuntimeFailure``), a case accepts both: the orchestrator relies on the refusal and on what it
leaves, not on the class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest

from aenv.core import ids
from aenv.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RuntimeFailure,
)
from aenv.core.net import NetSlot
from aenv.network import slots
from aenv.network.pool import SlotPool
from aenv.runtime.base import IMAGE_FILES, Instance, MemoryImage, Runtime, SandboxSpec
from aenv.runtime.fake import FakeRuntime
from tests.runtime.conftest import SandboxFactory, leftovers

pytestmark = pytest.mark.anyio

_fake_slots = itertools.count(61_900)
#: runsc's state file says ``running`` until the exited sandbox's process is reaped (~1-2 s
#: here, whose PID 1 reaps orphans slowly); the fake says ``stopped`` at once.
EXIT_SEEN_TIMEOUT_S = 15.0


class Harness(Protocol):
    runtime: Runtime

    def spec(self) -> SandboxSpec: ...

    async def slot(self) -> NetSlot: ...

    async def give_back(self, slot: NetSlot) -> None: ...

    def track(self, instance: Instance, spec: SandboxSpec) -> None: ...

    def broken_slot(self, slot: NetSlot, tmp: Path) -> NetSlot: ...

    def make_next_boot_fail(self) -> None: ...

    async def write_state(self, instance: Instance, text: str) -> None:
        """Change the guest's state (what a checkpoint must carry)."""
        ...

    async def read_state(self, instance: Instance) -> str: ...

    def die(self, instance: Instance) -> None:
        """Make the sandbox's runtime die from outside (not through the driver)."""
        ...


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

    async def write_state(self, instance: Instance, text: str) -> None:
        self.runtime.remember(instance.sandbox_id, "contract", text)

    async def read_state(self, instance: Instance) -> str:
        return self.runtime.recall(instance.sandbox_id)["contract"]

    def die(self, instance: Instance) -> None:
        self.runtime.crash(instance.sandbox_id)


class FakeGuestHarness(FakeHarness):
    """The fake as a node runs it: each sandbox's guest listens in a real slot."""

    def __init__(self, tmp: Path, pool: SlotPool) -> None:
        super().__init__(tmp)
        self.runtime = FakeRuntime(guest=True)
        self.pool = pool

    async def slot(self) -> NetSlot:
        return await self.pool.acquire()

    async def give_back(self, slot: NetSlot) -> None:
        await self.pool.release(slot)


@pytest.fixture
async def fake_guests(pool: SlotPool, tmp_path: Path) -> AsyncIterator[FakeGuestHarness]:
    """Its sandboxes destroyed (their guests' sockets closed) before the pool removes the
    slots."""
    harness = FakeGuestHarness(tmp_path, pool)
    try:
        yield harness
    finally:
        for o in await harness.runtime.observe():
            await harness.runtime.destroy(Instance(o.sandbox_id, o.runtime_id, o.pid, None))


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

    # A file in the sandbox's /tmp: the root's writable layer lives in its memory
    # (overlay2 root:memory), so it travels inside the image.
    async def write_state(self, instance: Instance, text: str) -> None:
        await self.runtime.runsc.exec(
            instance.runtime_id, ["/bin/sh", "-c", 'printf %s "$1" > /tmp/contract', "sh", text]
        )

    async def read_state(self, instance: Instance) -> str:
        done = await self.runtime.runsc.exec(instance.runtime_id, ["cat", "/tmp/contract"])
        return done.text

    def die(self, instance: Instance) -> None:
        assert instance.pid is not None
        os.kill(instance.pid, signal.SIGKILL)


@pytest.fixture(params=["fake", "fake-guest", pytest.param("gvisor", marks=[
    pytest.mark.gvisor, pytest.mark.slow])])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    # Sync on purpose: an async fixture cannot pull in another async fixture on demand.
    if request.param == "fake":
        return FakeHarness(tmp_path)
    if request.param == "fake-guest":
        guests: FakeGuestHarness = request.getfixturevalue("fake_guests")
        return guests
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


async def _restore(h: Harness, image: MemoryImage, spec: SandboxSpec | None = None) -> Instance:
    """Restore into a fresh slot, as ``_boot`` boots."""
    spec = spec or h.spec()
    slot = await h.slot()
    try:
        instance = await h.runtime.restore(image, spec, slot)
    except BaseException:
        await h.give_back(slot)
        raise
    h.track(instance, spec)
    return instance


async def _precreate(h: Harness, spec: SandboxSpec) -> tuple[Instance, NetSlot]:
    """``precreate`` in a fresh slot, as ``_boot`` boots."""
    slot = await h.slot()
    try:
        instance = await h.runtime.precreate(spec, slot)
    except BaseException:
        await h.give_back(slot)
        raise
    h.track(instance, spec)
    return instance, slot


async def _statuses(h: Harness, sandbox_id: str) -> list[str]:
    return [o.status for o in await h.runtime.observe() if o.sandbox_id == sandbox_id]


async def _statuses_once_exited(h: Harness, sandbox_id: str) -> list[str]:
    """What observe says of a sandbox that was told to exit, once it is seen to (or time
    runs out: then the caller's assertion shows the last answer)."""
    deadline = time.monotonic() + EXIT_SEEN_TIMEOUT_S
    while (statuses := await _statuses(h, sandbox_id)) == ["running"]:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    return statuses


def _assert_nothing_left(h: Harness, sandbox_id: str, observed: list[str]) -> None:
    assert sandbox_id not in observed
    if isinstance(h, GvisorHarness):
        assert not h.factory.runtime.bundle_dir(sandbox_id).exists()


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


async def test_stop_ends_the_sandbox_at_once_and_destroy_then_removes_it(
        harness: Harness) -> None:
    """What a kill answers after: ``stop`` kills the sandbox without the runtime's CLI, in
    milliseconds; the ``destroy`` that follows leaves nothing, as for a live one."""
    spec = harness.spec()
    instance = await _boot(harness, spec)
    started = time.monotonic()
    await harness.runtime.stop(instance)
    took = time.monotonic() - started
    exit = await asyncio.wait_for(harness.runtime.wait_exit(instance), EXIT_SEEN_TIMEOUT_S)
    assert exit.cause in ("killed", "exited"), exit
    assert took < 0.5, took  # no CLI (one runsc call alone is ~50 ms here)
    await harness.runtime.stop(instance)  # idempotent
    await harness.runtime.destroy(instance)
    assert spec.sandbox_id not in {o.sandbox_id for o in await harness.runtime.observe()}
    if isinstance(harness, GvisorHarness):
        assert leftovers(harness.factory.runtime, [spec.sandbox_id]) == []


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


async def test_wait_exit_waits_for_the_runtime_and_returns_at_once_once_it_is_gone(
    harness: Harness, tmp_path: Path
) -> None:
    """A waiter sees a checkpoint that ends the sandbox and a destroy; a wait on a sandbox
    that is gone returns at once. (Deaths from outside: ``test_death.py``, and the fake's
    ``crash``.)"""
    first = await _boot(harness)
    waiter = asyncio.create_task(harness.runtime.wait_exit(first))
    await asyncio.sleep(0.2)
    assert not waiter.done()  # a running sandbox: nothing to report
    await harness.runtime.checkpoint(first, tmp_path / "img", leave_running=False)
    exit = await asyncio.wait_for(waiter, EXIT_SEEN_TIMEOUT_S)
    assert exit.cause == "exited" and exit.message
    await harness.runtime.destroy(first)
    assert (await asyncio.wait_for(harness.runtime.wait_exit(first), 5)).cause == "exited"

    second = await _boot(harness)
    waiter = asyncio.create_task(harness.runtime.wait_exit(second))
    await asyncio.sleep(0.2)
    await harness.runtime.destroy(second)
    exit = await asyncio.wait_for(waiter, EXIT_SEEN_TIMEOUT_S)
    assert exit.cause in ("killed", "exited") and exit.message


async def test_wait_exit_reports_a_death_from_outside(harness: Harness) -> None:
    """A runtime that dies without the driver (a crash, a kill) ends a wait with that cause;
    the sandbox is then ``stopped`` (or gone) and destroy still cleans up."""
    instance = await _boot(harness)
    waiter = asyncio.create_task(harness.runtime.wait_exit(instance))
    await asyncio.sleep(0.2)
    harness.die(instance)
    exit = await asyncio.wait_for(waiter, EXIT_SEEN_TIMEOUT_S)
    assert exit.cause in ("killed", "crashed"), exit
    assert await _statuses_once_exited(harness, instance.sandbox_id) in (["stopped"], [])
    await harness.runtime.destroy(instance)
    assert await _statuses(harness, instance.sandbox_id) == []


# ------------------------------------------------------------ checkpoint, restore, freeze, thaw
# Two real sandboxes per case: each costs seconds on gVisor.


async def test_checkpoint_leaves_the_source_running_and_its_image_restores_elsewhere(
    harness: Harness, tmp_path: Path
) -> None:
    source = await _boot(harness)
    await harness.write_state(source, "saved")

    # A destination that exists is refused and left alone. (The gVisor driver lets mkdir's
    # FileExistsError through rather than a domain error.)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine").write_text("not the driver's")
    with pytest.raises((FailedPrecondition, FileExistsError)):
        await harness.runtime.checkpoint(source, taken, leave_running=True)
    assert [p.name for p in taken.iterdir()] == ["mine"]
    assert await _statuses(harness, source.sandbox_id) == ["running"]

    image = await harness.runtime.checkpoint(source, tmp_path / "img", leave_running=True)
    assert image == MemoryImage.at(tmp_path / "img")  # all of IMAGE_FILES are there
    assert image.size_bytes > 0
    assert await _statuses(harness, source.sandbox_id) == ["running"]

    spec = harness.spec()
    child = await _restore(harness, image, spec)
    assert (child.sandbox_id, child.runtime_id) == (spec.sandbox_id, spec.sandbox_id)
    assert child.net is not None and source.net is not None
    assert child.net.index != source.net.index
    assert await _statuses(harness, child.sandbox_id) == ["running"]
    assert await _statuses(harness, source.sandbox_id) == ["running"]
    assert await harness.read_state(child) == "saved"

    # A torn image (one file missing) is refused and leaves nothing of the would-be sandbox.
    (image.path / IMAGE_FILES[-1]).unlink()
    torn = harness.spec()
    with pytest.raises((FailedPrecondition, RuntimeFailure)):
        await _restore(harness, image, torn)
    _assert_nothing_left(harness, torn.sandbox_id,
                         [o.sandbox_id for o in await harness.runtime.observe()])
    assert await _statuses(harness, child.sandbox_id) == ["running"]


async def test_a_precreated_sandbox_is_created_then_restored_in_place(
    harness: Harness, tmp_path: Path
) -> None:
    source = await _boot(harness)
    await harness.write_state(source, "saved")
    image = await harness.runtime.checkpoint(source, tmp_path / "img", leave_running=True)

    spec = harness.spec()
    pre, slot = await _precreate(harness, spec)
    assert await _statuses(harness, spec.sandbox_id) == ["created"]
    child = await harness.runtime.restore_precreated(pre, image)
    assert child.sandbox_id == spec.sandbox_id and child.net == slot
    assert await _statuses(harness, child.sandbox_id) == ["running"]
    assert await harness.read_state(child) == "saved"

    # A failed restore into one destroys it (its slot stays the caller's).
    (image.path / IMAGE_FILES[-1]).unlink()
    torn = harness.spec()
    doomed, _ = await _precreate(harness, torn)
    with pytest.raises((FailedPrecondition, RuntimeFailure)):
        await harness.runtime.restore_precreated(doomed, image)
    _assert_nothing_left(harness, torn.sandbox_id,
                         [o.sandbox_id for o in await harness.runtime.observe()])


async def test_a_precreated_sandbox_restored_as_another_id_is_that_sandbox(
    harness: Harness, tmp_path: Path
) -> None:
    """A resume into a pre-created sandbox: the instance has the resumed id and keeps the
    runtime's; observe, freeze, checkpoint and destroy all know it by the resumed id."""
    source = await _boot(harness)
    await harness.write_state(source, "resumed")
    image = await harness.runtime.checkpoint(source, tmp_path / "img", leave_running=True)
    spec = harness.spec()
    pre, _ = await _precreate(harness, spec)
    resumed_id = ids.new_sandbox_id()
    resumed = await harness.runtime.restore_precreated(pre, image, sandbox_id=resumed_id)
    assert (resumed.sandbox_id, resumed.runtime_id) == (resumed_id, pre.runtime_id)
    assert await harness.read_state(resumed) == "resumed"
    observed = {o.sandbox_id: o for o in await harness.runtime.observe()}
    assert spec.sandbox_id not in observed
    assert (observed[resumed_id].runtime_id, observed[resumed_id].status) == (
        pre.runtime_id, "running")
    await harness.runtime.freeze(resumed)
    assert await _statuses(harness, resumed_id) == ["paused"]
    await harness.runtime.thaw(resumed)
    await harness.runtime.checkpoint(resumed, tmp_path / "again", leave_running=True)
    await harness.runtime.destroy(resumed)
    _assert_nothing_left(harness, resumed_id,
                         [o.sandbox_id for o in await harness.runtime.observe()])
    _assert_nothing_left(harness, spec.sandbox_id, [])


async def test_freeze_thaw_then_a_checkpoint_that_ends_the_source(
    harness: Harness, tmp_path: Path
) -> None:
    spec = harness.spec()
    source = await _boot(harness, spec)
    sid = spec.sandbox_id

    # Thaw only what is frozen (runsc's control socket kills a sandbox it is asked to
    # resume while running; the CLI and the fake refuse), freeze only what runs.
    with pytest.raises((FailedPrecondition, RuntimeFailure)):
        await harness.runtime.thaw(source)
    assert await _statuses(harness, sid) == ["running"]
    await harness.runtime.freeze(source)
    assert await _statuses(harness, sid) == ["paused"]
    with pytest.raises((FailedPrecondition, RuntimeFailure)):
        await harness.runtime.freeze(source)
    await harness.runtime.thaw(source)
    assert await _statuses(harness, sid) == ["running"]
    await harness.write_state(source, "after the thaw")  # the guest runs again

    image = await harness.runtime.checkpoint(source, tmp_path / "img", leave_running=False)
    assert image == MemoryImage.at(tmp_path / "img")
    assert await _statuses_once_exited(harness, sid) == ["stopped"]
    with pytest.raises((NotFound, RuntimeFailure)):
        await harness.runtime.freeze(source)

    # Restorable under its own id, in a new slot, once the old runtime is gone: as a
    # resume after a spill to disk.
    await harness.runtime.destroy(source)
    with pytest.raises((NotFound, RuntimeFailure)):
        await harness.runtime.checkpoint(source, tmp_path / "gone", leave_running=True)
    assert not (tmp_path / "gone").exists()
    again = await _restore(harness, image, spec)
    assert again.net is not None and source.net is not None
    assert again.net.index != source.net.index
    assert await _statuses(harness, sid) == ["running"]
    assert await harness.read_state(again) == "after the thaw"
