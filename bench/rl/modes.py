"""The three ways to run the workload, on one :class:`~bench.rl.meter.MeteredClient` each.

* ``cold``: every episode creates a sandbox from the base template, writes the task's files,
  runs its whole setup, then the agent and the reward, then kills it.
* ``template``: each task's setup runs once in a sandbox, which is snapshotted (the snapshot
  is the template: ``create(snapshot_id)``) and killed; every episode creates from the
  snapshot, runs the agent and the reward, and is killed. No fork. The snapshots are deleted
  at the end. (A template build through ``aenv template`` would bake the same state into an
  image; the snapshot is what the node restores fastest and needs no Dockerfile.)
* ``fork``: one ``aenv.rl.RolloutPool`` for the tasks, which run at once (a trainer's
  batch): each task is prepared once (create + setup + the diff baseline); by default
  (``--branch-from snapshot``) the parent is then snapshotted and paused, and each rollout is
  created from the snapshot once one of the pool's ``parallel`` agent slots is free for it
  (one ``pool.run`` per task); with ``--branch-from parent``, rollouts are forked from the
  running parent in waves of ``parallel`` (one ``pool.run`` per wave, so no child waits,
  running, for an agent slot). Each finished rollout is killed (or, with ``keep``, paused, as
  a trainer does that wants them later); closing the pool kills the paused rollouts and the
  prepared parents, and deletes the snapshots.

Every mode runs at most ``parallel`` agents at once, the same agent and the same reward; no
mode computes diffs (``compute_diff=False``), so the grading work is the same in all three.
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from aenv.client import Sandbox
from aenv.rl import RolloutEnv, RolloutPool, Task, Trajectory
from aenv.rl.branch import BranchFrom
from aenv.rl.reward import score
from aenv.rl.task import NEVER_IDLE_PAUSE
from bench.rl.meter import MeteredClient
from bench.rl.workload import REWARD, Agent

MODES = ("cold", "template", "fork")
#: Every sandbox of the benchmark lives at most this long on the node (a crashed run's bound).
SANDBOX_TIMEOUT_S = 3600


async def _setup(sandbox: Sandbox, task: Task) -> None:
    """What ``aenv.rl.prepare`` does to a fresh sandbox, without the diff baseline."""
    await sandbox.run(f"mkdir -p {shlex.quote(task.workdir)}", check=True)
    await asyncio.gather(
        *(sandbox.write_file(task.path(p), data) for p, data in task.files.items())
    )
    for command in task.setup:
        result = await sandbox.run(command, cwd=task.workdir, timeout=task.setup_timeout_s)
        if not result.ok:
            raise RuntimeError(
                f"setup {command!r} exited {result.exit_code}: "
                f"{(result.stderr or result.stdout)[-300:]}"
            )


async def _episode(sandbox: Sandbox, task: Task, index: int) -> float | None:
    """The agent, then the reward, on ``sandbox``; the reward."""
    env = RolloutEnv(sandbox, task.workdir, index=index)
    await Agent().act(env)
    reward, _ = await score(REWARD, env)
    return reward


async def run_cold(
    client: MeteredClient, tasks: list[Task], group: int, parallel: int, keep: bool = False
) -> list[float | None]:
    gate = asyncio.Semaphore(parallel)

    async def one(task: Task, index: int) -> float | None:
        async with gate:
            sandbox = await client.create(
                "base", timeout=SANDBOX_TIMEOUT_S, metadata=NEVER_IDLE_PAUSE
            )
            try:
                await _setup(sandbox, task)
                return await _episode(sandbox, task, index)
            finally:
                await sandbox.kill()

    return list(await asyncio.gather(*(one(t, i) for t in tasks for i in range(group))))


async def run_template(
    client: MeteredClient, tasks: list[Task], group: int, parallel: int, keep: bool = False
) -> list[float | None]:
    gate = asyncio.Semaphore(parallel)

    async def build(task: Task) -> str:
        async with gate:
            sandbox = await client.create(
                "base", timeout=SANDBOX_TIMEOUT_S, metadata=NEVER_IDLE_PAUSE
            )
            try:
                await _setup(sandbox, task)
                return (await sandbox.snapshot()).snapshot_id
            finally:
                await sandbox.kill()

    async def one(task: Task, snapshot: str, index: int) -> float | None:
        async with gate:
            sandbox = await client.create(
                snapshot, timeout=SANDBOX_TIMEOUT_S, metadata=NEVER_IDLE_PAUSE
            )
            try:
                return await _episode(sandbox, task, index)
            finally:
                await sandbox.kill()

    client.role = "build"
    snapshots = list(await asyncio.gather(*(build(t) for t in tasks)))
    client.role = "episode"
    try:
        return list(
            await asyncio.gather(
                *(one(t, s, i) for t, s in zip(tasks, snapshots, strict=True) for i in range(group))
            )
        )
    finally:
        for snapshot in snapshots:
            await client.delete_snapshot(snapshot)


async def run_fork(
    client: MeteredClient, tasks: list[Task], group: int, parallel: int, keep: bool = False,
    branch_from: BranchFrom = "snapshot",
) -> list[float | None]:
    async with RolloutPool(
        client, max_parallel=parallel, keep=keep, rollout_timeout_s=SANDBOX_TIMEOUT_S,
        branch_from=branch_from,
    ) as pool:

        async def one(task: Task) -> list[float | None]:
            client.role = "parent"  # this asyncio task's: the other task's are its own
            await pool.prepare(task)
            client.role = "rollout"  # children of a snapshot are creates
            if branch_from == "snapshot":
                # One call: each child is created when one of the pool's agent slots is
                # free, so none waits running for a slot.
                trajectories = await pool.run(
                    task, _Indexed(0), group_size=group, reward=REWARD, compute_diff=False)
                return _rewards(trajectories)
            # Forks: one call per wave of ``parallel``, or the children forked ahead of an
            # agent slot would wait, running (and metered).
            rewards: list[float | None] = []
            done = 0
            while done < group:
                wave = min(parallel, group - done)
                rewards += _rewards(await pool.run(
                    task, _Indexed(done), group_size=wave, reward=REWARD, compute_diff=False))
                done += wave
            return rewards

        # The tasks at once, as a trainer's batch: one task's setup runs while the other's
        # rollouts do; the pool's ``parallel`` agent slots are shared.
        per_task = await asyncio.gather(*(one(task) for task in tasks))
    return [reward for rewards in per_task for reward in rewards]


def _rewards(trajectories: list[Trajectory]) -> list[float | None]:
    for t in trajectories:
        if t.infra_error or t.error:
            raise RuntimeError(f"rollout {t.index}: {t.infra_error or t.error}")
    return [t.reward for t in trajectories]


class _Indexed:
    """The workload's agent, with rollout indices continued across waves (the agent's fix
    depends on the index's parity, as in the other modes)."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    async def act(self, env: RolloutEnv) -> None:
        env.index += self.offset
        await Agent().act(env)


RUNNERS: dict[str, Any] = {"cold": run_cold, "template": run_template, "fork": run_fork}
