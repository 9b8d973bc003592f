"""``RolloutPool`` against a real node: G rollouts of a fix-the-failing-test task (created
from a snapshot of the paused parent, or forked from the running one), rewards,
trajectories, diffs, an agent that raises, cancellation, and nothing left behind."""

from __future__ import annotations

import asyncio

import pytest

from aenv.client import AsyncClient
from aenv.rl import RolloutEnv, RolloutPool, SetupFailed, Task
from tests.rl.conftest import REPO, REWARD, TASK, ScriptedAgent, on_node
from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]


async def test_four_rollouts_two_fix_the_bug(client: AsyncClient, node: NodeServer) -> None:
    async with RolloutPool(client, max_parallel=4) as pool:
        trajectories = await pool.run(TASK, ScriptedAgent(), group_size=4, reward=REWARD)
        prepared = await pool.prepare(TASK)  # cached: the same parent
        assert on_node(node, run=client.run_id) == [prepared.sandbox_id]  # children killed
        # The diffs resumed the parent for its side; it is paused again, and its snapshot
        # (what the children were created from) stays until the pool closes.
        assert await _paused(client, pool) == {prepared.sandbox_id}
        assert len(await client.list_snapshots(sandbox_id=prepared.sandbox_id)) == 1
    assert not await client.list_snapshots(sandbox_id=prepared.sandbox_id)

    assert [t.reward for t in trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert all(t.scored and t.error is None and t.infra_error is None for t in trajectories)
    assert len({t.sandbox_id for t in trajectories}) == 4
    assert prepared.sandbox_id not in {t.sandbox_id for t in trajectories}
    fixer, looker = trajectories[0], trajectories[1]
    assert [s.kind for s in fixer.steps] == ["run", "read", "edit", "write"]
    assert [s.kind for s in looker.steps] == ["run", "read", "run"]
    assert looker.steps[2].exit_code != 0 and "FAILED" in looker.steps[2].output
    assert all(s.duration_s >= 0 for t in trajectories for s in t.steps)
    assert fixer.reward_step is not None and fixer.reward_step.exit_code == 0
    assert {"agent", "diff", "reward"} <= set(fixer.timings)

    assert fixer.diff is not None and looker.diff is not None
    assert [c.path for c in fixer.diff.changed] == [f"{REPO}/calc.py"]
    assert [c.path for c in fixer.diff.added] == [f"{REPO}/NOTES.md"]
    assert fixer.diff.removed == []
    patch = fixer.diff.unified()
    assert f"--- a{REPO}/calc.py" in patch and f"+++ b{REPO}/calc.py" in patch
    assert "-    return a - b\n+    return a + b\n" in patch
    assert "+fixed add\n" in patch
    assert not looker.diff  # running the tests wrote only byte-code, which is excluded
    assert on_node(node, run=client.run_id) == []


async def test_prepare_is_cached_and_kept_rollouts_are_paused(client: AsyncClient,
                                                              node: NodeServer) -> None:
    async with RolloutPool(client) as pool:
        first = await pool.run(TASK, ScriptedAgent(), group_size=2, reward=REWARD, keep=True)
        second = await pool.run(TASK, ScriptedAgent(), group_size=1, reward=REWARD)
        parent = (await pool.prepare(TASK)).sandbox_id
        assert len(on_node(node, rl_task=TASK.key)) == 3  # the parent and two kept ones
        paused = await _paused(client, pool)
        assert paused == {parent, *(t.sandbox_id for t in first)} and all(t.kept for t in first)
        assert not second[0].kept and second[0].reward == 1.0
        assert [t.reward for t in first] == [1.0, 0.0]
        assert parent in on_node(node, **pool.labels)
    assert on_node(node, run=client.run_id) == []


async def test_a_raising_agent_is_recorded_and_the_others_are_fine(client: AsyncClient,
                                                                   node: NodeServer) -> None:
    class Flaky(ScriptedAgent):
        async def act(self, env: RolloutEnv) -> None:
            await super().act(env)
            if env.index == 1:
                raise ValueError("the model produced nonsense")

    def reward(env: RolloutEnv) -> float:  # a callable reward, for once
        return 0.5 + env.index

    async with RolloutPool(client) as pool:
        trajectories = await pool.run(TASK, Flaky(), group_size=3, reward=reward)
    bad = trajectories[1]
    assert bad.error == "ValueError: the model produced nonsense"
    assert bad.infra_error is None and len(bad.steps) == 3
    assert [t.error for t in (trajectories[0], trajectories[2])] == [None, None]
    assert [t.reward for t in trajectories] == [0.5, 1.5, 2.5]  # the state is still scored
    assert trajectories[0].reward_step is None
    assert on_node(node, run=client.run_id) == []


async def test_cancelling_run_cleans_up(client: AsyncClient, node: NodeServer) -> None:
    started: list[int] = []
    all_started = asyncio.Event()

    class Slow:
        async def act(self, env: RolloutEnv) -> None:
            await env.run("true")
            started.append(env.index)
            if len(started) == 3:
                all_started.set()
            await asyncio.sleep(3600)

    async with RolloutPool(client) as pool:
        run = asyncio.ensure_future(pool.run(TASK, Slow(), group_size=3, reward=REWARD))
        # Cancelled while every agent sleeps: the e2b SDK turns a cancellation in the middle
        # of a command into a ConnectError in a task of its own that nobody awaits (anyio's
        # test runner fails on that), which is the SDK's, not the pool's, to fix.
        await asyncio.wait_for(all_started.wait(), 120)
        assert len(on_node(node, **pool.labels)) == 4  # the parent and three rollouts
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert on_node(node, **pool.labels) == [(await pool.prepare(TASK)).sandbox_id]
    assert on_node(node, run=client.run_id) == []


async def test_failing_setup_is_typed_and_leaves_nothing(client: AsyncClient,
                                                         node: NodeServer) -> None:
    broken = Task(setup=("echo preparing", "echo 'no such package' >&2; exit 3"))
    async with RolloutPool(client) as pool:
        with pytest.raises(SetupFailed, match="no such package") as failed:
            await pool.run(broken, ScriptedAgent(), group_size=2, reward="true")
        assert failed.value.result.exit_code == 3 and "exit 3" in failed.value.command
        assert on_node(node, run=client.run_id) == []


async def test_rollouts_forked_from_the_running_parent(client: AsyncClient,
                                                      node: NodeServer) -> None:
    async with RolloutPool(client, branch_from="parent") as pool:
        trajectories = await pool.run(TASK, ScriptedAgent(), group_size=2, reward=REWARD)
        prepared = await pool.prepare(TASK)
        assert await _paused(client, pool) == set()  # the parent runs; no snapshot was taken
        assert not await client.list_snapshots(sandbox_id=prepared.sandbox_id)
    assert [t.reward for t in trajectories] == [1.0, 0.0]
    assert [c.path for c in trajectories[0].diff.changed] == [f"{REPO}/calc.py"]  # type: ignore[union-attr]
    assert on_node(node, run=client.run_id) == []


async def _paused(client: AsyncClient, pool: RolloutPool) -> set[str]:
    return {s.sandbox_id for s in await client.list(state="paused", metadata=pool.labels)}
