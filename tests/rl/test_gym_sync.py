"""The Gym envs and the sync pool against a real node: fresh state per episode, gymnasium's
own env checker, and the sync facade called from two threads at once."""

from __future__ import annotations

import threading

import pytest

from aenv.client import AsyncClient
from aenv.client.sync import Client
from aenv.rl import RolloutPool, Task
from aenv.rl.gym import AsyncSandboxEnv, SandboxEnv
from aenv.rl.sync import RolloutPool as SyncRolloutPool
from aenv.rl.sync import SyncRolloutEnv
from tests.rl.conftest import REPO, REWARD, TASK, on_node
from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


@pytest.mark.anyio
async def test_async_env_episodes_start_fresh(client: AsyncClient, node: NodeServer) -> None:
    async with RolloutPool(client) as pool:
        env = AsyncSandboxEnv(TASK, pool, reward=REWARD, max_steps=5)
        observation, info = await env.reset()
        assert observation == TASK.prompt
        first = info["sandbox_id"]
        obs, reward, terminated, truncated, info = await env.step(
            "echo episode one > /home/user/mark && cat /home/user/mark")
        assert (obs, reward, terminated, truncated) == ("episode one\n", 0.0, False, False)
        obs, reward, terminated, _, _ = await env.step(
            f"sed -i 's/a - b/a + b/' {REPO}/calc.py")
        obs, reward, terminated, _, info = await env.step("submit")
        assert (reward, terminated, info["exit_code"]) == (1.0, True, 0)

        _, info = await env.reset()
        assert info["sandbox_id"] != first
        assert first not in on_node(node, run=client.run_id)  # the last episode's is gone
        obs, *_ = await env.step("cat /home/user/mark; echo $?")
        assert obs.startswith("1\n") and "No such file" in obs  # stdout, then stderr
        obs, reward, terminated, _, _ = await env.step("submit")
        assert (reward, terminated) == (0.0, True)  # the fix of episode one is gone too
        await env.close()
        assert on_node(node, **pool.labels) == [(await pool.prepare(TASK)).sandbox_id]
    assert on_node(node, run=client.run_id) == []


def test_sync_env_passes_gymnasiums_checker(node: NodeServer) -> None:
    gymnasium = pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    with Client(node.url, API_KEY) as client:
        env = SandboxEnv(Task(prompt="Explore."), client, max_steps=3, step_timeout_s=10)
        assert isinstance(env, gymnasium.Env)
        check_env(env, skip_render_check=True)
        observation, _ = env.reset(seed=1)
        assert env.observation_space.contains(observation)
        obs, *_ = env.step("printf 'caf\\xc3\\xa9\\n'")
        assert obs == "caf?\n" and env.observation_space.contains(obs)  # kept in its space
        env.close()
        assert on_node(node, run=client.run_id) == []
    assert on_node(node, run=client.run_id) == []


def test_sync_pool_from_two_threads(node: NodeServer) -> None:
    class ThreadAgent:
        """A plain ``def act``: it runs in a worker thread with the sync env."""

        def act(self, env: SyncRolloutEnv) -> None:
            assert "a - b" in env.read_file(f"{REPO}/calc.py")
            if env.index == 0:
                env.edit(f"{REPO}/calc.py", "a - b", "a + b")
            env.run("true")

    results: dict[int, list[float | None]] = {}
    errors: list[BaseException] = []
    with Client(node.url, API_KEY) as client, SyncRolloutPool(client, max_parallel=4) as pool:
        def trainer(n: int) -> None:
            try:
                trajectories = pool.run(TASK, ThreadAgent(), group_size=2, reward=REWARD)
                results[n] = [t.reward for t in trajectories]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=trainer, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors, errors
        assert results == {0: [1.0, 0.0], 1: [1.0, 0.0]}
        assert len(on_node(node, rl_task=TASK.key)) == 1  # one prepared parent for both
    assert on_node(node, run=client.run_id) == []
