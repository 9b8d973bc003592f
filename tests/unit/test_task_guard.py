"""The task guard (orchestrator/task_guard.py): when a sandbox's host tasks run away, its guest
processes are killed once, as the sandbox's operation, and again only after it grew anew."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from aenv.core.net import NetSlot
from aenv.core.states import SandboxState
from aenv.orchestrator import task_guard
from aenv.orchestrator.instance_codec import instance_json
from aenv.orchestrator.owners import Owners
from aenv.runtime.base import Instance
from aenv.store.models import SandboxRecord

AT = 2048


def test_a_runaway_is_at_the_threshold_and_then_only_after_regrowth() -> None:
    assert not task_guard.runaway(AT - 1, AT, 0)
    assert task_guard.runaway(AT, AT, 0)
    assert not task_guard.runaway(None, AT, 0)
    assert not task_guard.runaway(10 * AT, 0, 0)  # off
    floor = 3400  # what the last kill left
    assert not task_guard.runaway(floor + task_guard.REGROWTH - 1, AT, floor)
    assert task_guard.runaway(floor + task_guard.REGROWTH, AT, floor)


def _instance(sandbox_id: str) -> Instance:
    slot = NetSlot(index=1, netns="n", netns_path="/n", host_ifname="h", guest_ifname="g")
    return Instance(sandbox_id, f"rt-{sandbox_id}", 123, slot)


def _record(sandbox_id: str) -> SandboxRecord:
    instance = _instance(sandbox_id)
    assert instance.net is not None
    slot = instance.net
    return SandboxRecord(
        sandbox_id=sandbox_id, template_id="base", state=SandboxState.RUNNING, version=1,
        created_at=0, started_at=0, end_at=0, cpu_count=1, memory_mb=512, disk_size_mb=1024,
        envd_token="t", client_id="c", instance=instance_json(slot, instance))


class FakeNode:
    """What the guard uses of the node: settings, store, runtime, owners."""

    def __init__(self, records: list[SandboxRecord]) -> None:
        self.records = {r.sandbox_id: r for r in records}
        self.tasks: dict[str, int] = {}
        self.killed: list[str] = []
        self.events: list[tuple[str, str, Any]] = []
        self.settings = SimpleNamespace(runaway_tasks=AT, host_tasks_limit=8192)
        self.owners = Owners()
        self.store = SimpleNamespace(list=self._list, get=self._get, add_event=self._event)
        self.runtime = SimpleNamespace(host_tasks=lambda i: self.tasks.get(i.sandbox_id),
                                       kill_guest_processes=self._kill)

    async def _list(self, states: list[SandboxState]) -> list[SandboxRecord]:
        return [r for r in self.records.values() if r.state in states]

    async def _get(self, sandbox_id: str) -> SandboxRecord | None:
        return self.records.get(sandbox_id)

    async def _event(self, sandbox_id: str, kind: str, detail: Any, **_: Any) -> None:
        self.events.append((sandbox_id, kind, detail))

    async def _kill(self, instance: Instance) -> int:
        self.killed.append(instance.sandbox_id)
        self.tasks[instance.sandbox_id] += 1000  # the dying processes add host tasks
        return 400


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_guard, "SETTLE_S", 0)
    monkeypatch.setattr(task_guard, "LIST_S", 0)


def _started(node: FakeNode) -> task_guard.TaskGuard:
    """A guard past its first look (which takes every sandbox's tasks as its floor)."""
    guard = task_guard.TaskGuard(node)  # type: ignore[arg-type]
    guard._started = True
    return guard


def test_only_the_runaway_is_stopped_and_not_again_until_it_grows() -> None:
    node = FakeNode([_record("bomb"), _record("calm")])
    node.tasks = {"bomb": 100, "calm": 900}
    guard = _started(node)

    async def main() -> None:
        await guard.check_all()
        assert node.killed == []
        node.tasks["bomb"] = 2300
        await guard.check_all()
        assert node.killed == ["bomb"] and guard.floors == {"bomb": 3300}
        assert node.events == [("bomb", task_guard.EVENT, {
            "hostTasks": 2300, "hostTasksAfter": 3300, "limit": 8192, "killed": 400})]
        await guard.check_all()  # still far above the threshold: the runtime kept them
        assert node.killed == ["bomb"]
        node.tasks["bomb"] = 3300 + task_guard.REGROWTH
        await guard.check_all()
        assert node.killed == ["bomb", "bomb"]

    asyncio.run(main())


def test_a_busy_or_changed_sandbox_is_left_alone() -> None:
    node = FakeNode([_record("bomb")])
    node.tasks = {"bomb": 2300}
    guard = _started(node)

    async def main() -> None:
        hold = asyncio.Event()

        async def snapshot() -> None:
            await hold.wait()

        busy = asyncio.ensure_future(node.owners.run("bomb", "snapshot", snapshot))
        await asyncio.sleep(0)
        await guard.check_all()  # the snapshot has the turn: next round
        assert node.killed == []
        hold.set()
        await busy
        # Paused meanwhile (the listing is older): the record decides, nothing is killed.
        node.records["bomb"] = replace(node.records["bomb"], state=SandboxState.PAUSED)
        await guard.stop(_record("bomb"), _instance("bomb"), node.tasks["bomb"])
        assert node.killed == [] and node.events == []

    asyncio.run(main())


def test_a_restarted_node_counts_only_new_growth() -> None:
    # Stopped before the restart (the runtime kept its tasks), and a calm one: nothing is
    # killed at the first look; growth past the floor is a runaway again.
    node = FakeNode([_record("bombed"), _record("calm")])
    node.tasks = {"bombed": 3500, "calm": 70}
    guard = task_guard.TaskGuard(node)  # type: ignore[arg-type]

    async def main() -> None:
        await guard.check_all()
        assert node.killed == [] and guard.floors == {"bombed": 3500, "calm": 70}
        node.tasks["calm"] = AT
        await guard.check_all()
        assert node.killed == ["calm"]
        node.tasks["bombed"] = 3500 + task_guard.REGROWTH
        await guard.check_all()
        assert node.killed == ["calm", "bombed"]

    asyncio.run(main())


def test_a_kill_that_fails_is_tried_again_only_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode([_record("bomb")])
    node.tasks = {"bomb": 2300}
    guard = _started(node)
    calls: list[str] = []

    async def broken(instance: Instance) -> int:
        calls.append(instance.sandbox_id)
        raise RuntimeError("control socket gone")

    node.runtime.kill_guest_processes = broken

    async def main() -> None:
        await guard.check_all()
        await guard.check_all()  # within RETRY_S: left alone
        assert calls == ["bomb"] and node.events == []
        monkeypatch.setattr(task_guard, "RETRY_S", 0)
        await guard.check_all()
        assert calls == ["bomb", "bomb"]

    asyncio.run(main())
