"""A kill gets the sandbox's turn even from an operation that does not unwind at the first
cancel (``orchestrator/owners.py``): it cancels again until the operation lets go, and says
where the operation waited."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aenv.orchestrator import owners as owners_module
from aenv.orchestrator.owners import Owners


async def _stubborn(ended: list[str], cancels: int) -> None:
    """Waits; takes the first ``cancels`` cancels for the end of one step and goes on to the
    next (what a cancel lost as an awaited call ends looks like)."""
    for _ in range(cancels):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("operation")


async def _kill_preempting(cancels: int) -> tuple[list[str], float]:
    owners = Owners()
    ended: list[str] = []
    operation = asyncio.create_task(
        owners.run("sbx", "pause", lambda: _stubborn(ended, cancels)))
    await asyncio.sleep(0.05)
    owners.begin_kill("sbx")

    async def teardown() -> None:
        ended.append("kill")

    began = asyncio.get_running_loop().time()
    # Bounded: a kill left waiting for the turn would hang the test, not fail it.
    await asyncio.wait_for(owners.start_kill("sbx", teardown, deadline=10), 5)
    took = asyncio.get_running_loop().time() - began
    with pytest.raises(BaseException):  # noqa: B017 - NotFound or CancelledError: gone
        await operation
    return ended, took


def test_a_kill_takes_the_turn_from_an_operation_that_swallowed_its_cancel(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(owners_module, "RECANCEL_S", 0.1)
    monkeypatch.setattr(owners_module, "STACK_AFTER_S", 0.2)
    with caplog.at_level(logging.WARNING, "aenv.orchestrator.owners"):
        ended, took = asyncio.run(_kill_preempting(cancels=3))
    assert ended == ["operation", "kill"]  # the teardown ran after the operation let go
    assert took < 2.0
    assert "_stubborn" in caplog.text  # where the operation waited


def test_an_operation_that_unwinds_at_once_is_waited_for_without_a_word(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "aenv.orchestrator.owners"):
        ended, took = asyncio.run(_kill_preempting(cancels=0))
    assert ended == ["operation", "kill"]
    assert took < 0.5
    assert "waits" not in caplog.text
