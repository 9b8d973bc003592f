"""The pre-created pool: what it takes out of its queue is destroyed even when it is cancelled;
it keeps a fork's family; it grows to demand and shrinks back."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aenv.orchestrator import precreated
from aenv.orchestrator.deps import Template
from aenv.orchestrator.pool_demand import Demand
from aenv.orchestrator.precreated import Precreated, PrecreatedPool, shape, shape_of


def _node(tmp_path: Path) -> Any:
    settings = SimpleNamespace(default_cpu_count=1, default_memory_mb=512)
    return SimpleNamespace(settings=settings, envd_bundle=tmp_path / "envd")


def _slow_release(released: list[str]) -> Any:
    """``release`` as the host makes it: ~0.3 s (reaping the processes), then noted."""
    async def release(node: Any, sandbox_id: str, slot: Any, instance: Any) -> None:
        await asyncio.sleep(0.3)
        released.append(sandbox_id)
    return release


def test_a_pool_stopped_while_it_changes_shape_destroys_the_sandbox_it_was_discarding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in CI: the node stopped while the pool discarded sandboxes of a deleted
    snapshot's shape; the cancelled destroy left that sandbox's runsc processes running."""
    released: list[str] = []

    async def never(*args: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(precreated, "release", _slow_release(released))
    monkeypatch.setattr(precreated, "precreate_sandbox", never)

    async def scenario() -> None:
        pool = PrecreatedPool(size=2)
        pool._node = _node(tmp_path)
        old = shape([tmp_path / "snapshot-layer"], tmp_path / "envd", 1, 512, None)
        for name in ("a", "b"):
            pool._ready.append(Precreated(name, old, slot=None, instance=None))  # type: ignore[arg-type]
        pool._template = Template("base", None, (tmp_path / "base-layer",))
        fill = asyncio.create_task(pool._fill())
        await asyncio.sleep(0.05)  # in the destroys of "a" and "b"
        fill.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fill
        assert sorted(released) == ["a", "b"] and pool.ready == 0
        await pool.close()
        assert sorted(released) == ["a", "b"]

    asyncio.run(scenario())


def test_a_shape_change_destroys_the_old_sandboxes_at_once_then_makes_new_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a fork changed the shape, 16 old sandboxes destroyed one after another (~0.2 s
    each on the host) held back the first new one by 3.2 s: the next wave found half of its
    children made. They go all at once, and every old one, wherever it is in the queue."""
    loop_time: list[float] = []
    released: list[str] = []
    making = asyncio.Event()

    async def make(node: Any, sandbox_id: str, template: Template) -> Any:
        loop_time.append(asyncio.get_running_loop().time())
        making.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(precreated, "release", _slow_release(released))
    monkeypatch.setattr(precreated, "precreate_sandbox", make)

    async def scenario() -> None:
        pool = PrecreatedPool(size=10)
        pool._node = _node(tmp_path)
        base = Template("base", None, (tmp_path / "base-layer",))
        fork = Template("fork", None, (tmp_path / "fork-layer",))
        old, new = (shape_of(pool._node, t) for t in (base, fork))
        pool._ready.extend(Precreated(f"old{i}", old, slot=None, instance=None)  # type: ignore[arg-type]
                           for i in range(8))
        pool._ready.insert(4, Precreated("new0", new, slot=None, instance=None))  # type: ignore[arg-type]
        pool._ready.append(Precreated("old8", old, slot=None, instance=None))  # type: ignore[arg-type]
        pool._template = fork
        started = asyncio.get_running_loop().time()
        fill = asyncio.create_task(pool._fill())
        await making.wait()
        fill.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fill
        assert sorted(released) == sorted(f"old{i}" for i in range(9))
        assert [p.sandbox_id for p in pool._ready] == ["new0"]
        assert loop_time[0] - started < 0.6  # one destroy's time, not nine

    asyncio.run(scenario())


@pytest.mark.parametrize("as_family", [True, False])
def test_a_fork_family_is_kept_though_the_forks_image_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_family: bool) -> None:
    """A fork's memory image is discarded right after its children started, and the pool
    needs none: ``want_family`` keeps the family of a parent on other layers than the default
    template's. A template wanted with an image that is gone (a deleted snapshot's) sends
    the pool back to the default (before, a fork's family did the same)."""
    made: list[str] = []

    async def make(node: Any, sandbox_id: str, template: Template) -> Any:
        made.append(template.template_id)
        return None, SimpleNamespace(sandbox_id=sandbox_id)

    monkeypatch.setattr(precreated, "precreate_sandbox", make)

    async def scenario() -> None:
        pool = PrecreatedPool(size=1)
        pool._node = _node(tmp_path)
        base = Template("base", None, (tmp_path / "base-layer",))
        pool._default = pool._template = base
        family = Template("custom", None, (tmp_path / "custom-layer",),
                          image=tmp_path / "discarded-image")  # as after the fork's discard
        if as_family:
            pool.want_family(family)
        else:
            pool.want(family)
        fill = asyncio.create_task(pool._fill())
        await asyncio.sleep(0.05)
        fill.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fill

    asyncio.run(scenario())
    assert made == (["custom"] if as_family else ["base"])


def test_the_pool_grows_to_a_demand_and_shrinks_back_after_its_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork of 6 from a pool that keeps 2 finds 2; the pool then makes 6 for the next
    one, and once that demand has left the window destroys the 4 it no longer needs."""
    made: list[str] = []
    released: list[str] = []

    async def make(node: Any, sandbox_id: str, template: Template) -> Any:
        made.append(sandbox_id)
        return None, SimpleNamespace(sandbox_id=sandbox_id)

    async def release(node: Any, sandbox_id: str, slot: Any, instance: Any) -> None:
        released.append(sandbox_id)

    monkeypatch.setattr(precreated, "precreate_sandbox", make)
    monkeypatch.setattr(precreated, "release", release)

    async def until(what: str, check: Any) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(what)

    async def scenario() -> None:
        demand = Demand(floor=2, ceiling=8, window_s=0.5)
        pool = PrecreatedPool(size=2, demand=demand)
        pool._node = _node(tmp_path)
        base = Template("base", None, (tmp_path / "base-layer",))
        pool._default = pool._template = base
        fill = asyncio.create_task(pool._fill())
        await until("the floor", lambda: pool.ready == 2)
        pool.expect(6)  # a fork of 6
        taken = [pool.take(base) for _ in range(6)]
        assert sum(t is not None for t in taken) == 2
        await until("grown to the demand", lambda: pool.ready == 6)
        assert len(made) == 8 and not released
        await until("shrunk after the window", lambda: pool.ready == 2)
        assert released == made[-4:][::-1]  # the newest go first
        fill.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fill
        await pool.close()

    asyncio.run(scenario())
