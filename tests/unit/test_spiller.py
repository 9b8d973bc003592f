"""The spiller writes at most ``max_concurrent_spills`` frozen sandboxes at once; a spill
waiting for a writer holds no sandbox, and one re-scheduled meanwhile waits for its new time."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from aenv.core.settings import Settings
from aenv.orchestrator import spill as spill_module
from aenv.orchestrator.spill import Spiller
from aenv.orchestrator.supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_spills_are_bounded_and_a_rescheduled_waiting_one_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writing: set[str] = set()
    most = 0
    written: list[str] = []
    release = asyncio.Event()

    async def fake_spill(node: object, sandbox_id: str) -> None:
        nonlocal most
        writing.add(sandbox_id)
        most = max(most, len(writing))
        await release.wait()
        writing.discard(sandbox_id)
        written.append(sandbox_id)

    monkeypatch.setattr(spill_module, "spill", fake_spill)
    settings = Settings(max_concurrent_spills=2, pause_hot_s=0, max_hot_paused=100)
    spiller = Spiller(settings)
    supervisor = Supervisor()
    node = SimpleNamespace(supervisor=supervisor, owners=SimpleNamespace(killed=lambda _: False))
    await spiller.start(node)  # type: ignore[arg-type]
    for sid in ("a", "b", "c", "d"):
        spiller.schedule(sid, delay=0.0)
    for _ in range(100):
        if len(writing) == 2:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert len(writing) == 2, "two write at once, the others wait for a writer"
    # Re-scheduled while waiting (paused again after a resume): the newer schedule spills it.
    waiting = ({"a", "b", "c", "d"} - writing).pop()
    spiller.schedule(waiting, delay=3600.0)
    release.set()
    for _ in range(200):
        if len(written) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert most == 2
    assert sorted(written) == sorted({"a", "b", "c", "d"} - {waiting})
    assert spiller.pending == 1
    await supervisor.close()
    await spiller.close()
