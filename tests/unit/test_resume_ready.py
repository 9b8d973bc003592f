"""The bookkeeping of paused sandboxes kept ready to resume (``orchestrator/resume_ready.py``):
at most ``size``, the oldest given up for a newer one, never one another operation holds,
and each given up after ``keep_s`` (again later when it was busy then)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from aenv.orchestrator import resume_ready
from aenv.orchestrator.owners import Owners
from aenv.orchestrator.resume_ready import ResumeReady
from aenv.orchestrator.supervisor import Supervisor


def _ready(size: int, keep_s: float) -> tuple[ResumeReady, list[str], list[str]]:
    made: list[str] = []
    given_up: list[str] = []
    pool = ResumeReady(size, keep_s)
    pool._node = SimpleNamespace(  # type: ignore[assignment]
        workspaces=object(), drain=SimpleNamespace(on=False), owners=Owners(),
        supervisor=Supervisor())

    async def make(sandbox_id: str) -> bool:
        made.append(sandbox_id)
        return True

    async def unmake(sandbox_id: str) -> bool:
        given_up.append(sandbox_id)
        return True

    pool._make = make  # type: ignore[method-assign]
    pool._unmake = unmake  # type: ignore[method-assign]
    return pool, made, given_up


async def _hold(owners: Owners, sandbox_id: str, until: asyncio.Event) -> asyncio.Task[Any]:
    async def wait() -> None:
        await until.wait()

    task = asyncio.create_task(owners.run(sandbox_id, "resume", wait))
    await asyncio.sleep(0.01)
    return task


def test_the_oldest_is_given_up_for_a_newer_one_unless_it_is_busy() -> None:
    async def scenario() -> None:
        pool, made, given_up = _ready(size=2, keep_s=600)
        assert await pool.offer("a") and await pool.offer("b")
        assert await pool.offer("c")
        assert given_up == ["a"] and pool.ready == 2
        # "b" is being resumed: "c" is given up instead of it.
        release = asyncio.Event()
        held = await _hold(pool.node.owners, "b", release)
        assert await pool.offer("d")
        assert given_up == ["a", "c"] and pool.ready == 2
        # Both held: nothing is given up and "e" is not made.
        other = await _hold(pool.node.owners, "d", release)
        assert not await pool.offer("e")
        assert made == ["a", "b", "c", "d"] and pool.ready == 2
        release.set()
        await asyncio.gather(held, other)
        pool.forget("b")  # the resume took it
        assert await pool.offer("e") and pool.ready == 2

    asyncio.run(scenario())


def test_each_is_given_up_after_keep_s_and_a_busy_one_again_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resume_ready, "BUSY_RETRY_S", 0.2)

    async def scenario() -> None:
        pool, _, given_up = _ready(size=4, keep_s=0.1)
        expire = asyncio.create_task(pool._expire())
        release = asyncio.Event()
        held = await _hold(pool.node.owners, "b", release)
        await pool.offer("a")
        pool._made["b"] = pool._made["a"]  # made ready just before it was held
        pool._wake.set()
        await asyncio.sleep(0.3)
        assert given_up == ["a"] and pool.ready == 1
        release.set()
        await held
        await asyncio.sleep(0.3)
        assert given_up == ["a", "b"] and pool.ready == 0
        expire.cancel()
        with pytest.raises(asyncio.CancelledError):
            await expire

    asyncio.run(scenario())
