"""The supervisor of the node's background loops: a loop that raises is logged with its name
and started again after a backoff, its health says so, and close stops every loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aenv.orchestrator.supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_a_loop_that_raises_is_logged_and_restarted(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    runs = 0
    third_run = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError(f"pass {runs} broke")
        third_run.set()
        await asyncio.Event().wait()  # then it runs as a healthy loop does: forever

    supervisor = Supervisor(backoff_s=0.01, backoff_max_s=0.05)
    with caplog.at_level(logging.ERROR, logger="aenv.orchestrator.supervisor"):
        supervisor.spawn("flaky", flaky)
        await asyncio.wait_for(third_run.wait(), timeout=5)
    [health] = supervisor.health()
    assert (health.name, health.state, health.failures) == ("flaky", "running", 2)
    assert health.last_error == "RuntimeError: pass 2 broke"
    failures = [r for r in caplog.records if "background loop flaky failed" in r.getMessage()]
    assert len(failures) == 2
    assert failures[0].exc_info is not None and "pass 1 broke" in str(failures[0].exc_info[1])
    await supervisor.close()
    assert supervisor.health()[0].state == "stopped"


async def test_a_failing_loop_backs_off_and_says_when_it_retries() -> None:
    async def broken() -> None:
        raise OSError("the store is gone")

    supervisor = Supervisor(backoff_s=10.0)
    supervisor.spawn("broken", broken)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if supervisor.health()[0].state == "backing-off":
            break
    [health] = supervisor.health()
    assert health.state == "backing-off" and health.failures == 1
    assert health.retry_at is not None and health.failed_at is not None
    assert 9.0 < health.retry_at - health.failed_at <= 10.5
    await supervisor.close()  # cancels the backoff's sleep at once
    assert supervisor.health()[0].state == "stopped"


async def test_a_loop_that_returns_is_done_and_close_stops_the_rest() -> None:
    stopped = asyncio.Event()

    async def once() -> None:
        return

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    supervisor = Supervisor()
    supervisor.spawn("once", once)
    supervisor.spawn("forever", forever)
    with pytest.raises(ValueError, match="runs already"):
        supervisor.spawn("once", once)
    await asyncio.sleep(0.05)
    assert {h.name: h.state for h in supervisor.health()} == {"forever": "running",
                                                              "once": "done"}
    await supervisor.close()
    assert stopped.is_set()
    assert {h.name: h.state for h in supervisor.health()} == {"forever": "stopped",
                                                              "once": "done"}
    with pytest.raises(RuntimeError, match="closed"):
        supervisor.spawn("late", once)
