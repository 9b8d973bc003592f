"""The idle auto-pause's policy and one pass of its loop, over a stub node (the real pause:
``tests/server/test_idle_pause.py``)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from aenv.core.errors import Conflict, InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator import idle
from aenv.orchestrator.activity import Activity
from aenv.orchestrator.context import StreamRegistry
from aenv.store.models import SandboxRecord


def record(sandbox_id: str, metadata: dict[str, str] | None = None) -> SandboxRecord:
    return SandboxRecord(
        sandbox_id=sandbox_id, template_id="base", state=SandboxState.RUNNING, version=1,
        created_at=0, started_at=0, end_at=0, cpu_count=1, memory_mb=512, disk_size_mb=1024,
        envd_token="t", client_id="c", metadata=metadata or {})


@pytest.mark.parametrize("value", ["0", "2", "86400"])
def test_whole_seconds_are_accepted(value: str) -> None:
    idle.check_metadata({idle.METADATA_KEY: value})


@pytest.mark.parametrize("value", ["", "soon", "-1", "1.5", " 3", "+3", "3_0", "٣"])
def test_anything_else_is_a_400(value: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        idle.check_metadata({idle.METADATA_KEY: value})
    assert caught.value.http_status == 400


def test_the_sandbox_wins_over_the_node_default() -> None:
    assert idle.idle_limit(record("a"), None) is None
    assert idle.idle_limit(record("a"), 30) == 30
    assert idle.idle_limit(record("a", {idle.METADATA_KEY: "5"}), None) == 5
    assert idle.idle_limit(record("a", {idle.METADATA_KEY: "5"}), 30) == 5
    assert idle.idle_limit(record("a", {idle.METADATA_KEY: "0"}), 30) is None
    assert idle.idle_limit(record("a", {idle.METADATA_KEY: "junk"}), 30) == 30


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def stub_node(records: list[SandboxRecord], default: int | None = None) -> Any:
    async def listed(states: Any) -> list[SandboxRecord]:
        return records

    return SimpleNamespace(
        store=SimpleNamespace(list=listed), activity=Activity(Clock()),
        streams=StreamRegistry(), settings=SimpleNamespace(idle_pause_s=default))


def test_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [record("quiet", {idle.METADATA_KEY: "2"}), record("streaming"),
               record("touched", {idle.METADATA_KEY: "2"}), record("off", {idle.METADATA_KEY: "0"})]
    node = stub_node(records, default=2)
    clock: Clock = node.activity._clock
    asked: dict[str, bool] = {}

    async def pause(node: Any, sandbox_id: str, *, unless: Callable[[], bool],
                    wait: float | None = None) -> None:
        asked[sandbox_id] = unless()
        if asked[sandbox_id]:
            raise Conflict("in use")

    monkeypatch.setattr(idle, "pause", pause)
    node.activity.touch("gone")
    assert anyio.run(idle.pause_idle_once, node) == []  # first sight: the clocks start
    assert node.activity.idle_for("gone") is None
    node.streams.add("streaming", object())
    clock.now += 3
    node.activity.touch("touched")
    assert anyio.run(idle.pause_idle_once, node) == ["quiet"]
    assert asked == {"quiet": False}

    # Traffic between the look and the pause taking the record: given back, not paused.
    clock.now += 3

    async def pause_after_traffic(node: Any, sandbox_id: str, *,
                                  unless: Callable[[], bool], wait: float | None = None
                                  ) -> None:
        node.activity.touch(sandbox_id)
        await pause(node, sandbox_id, unless=unless)

    monkeypatch.setattr(idle, "pause", pause_after_traffic)
    asked.clear()
    assert anyio.run(idle.pause_idle_once, node) == []
    assert asked == {"quiet": True, "touched": True}
