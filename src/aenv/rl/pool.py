"""``RolloutPool``: G rollouts of a task forked from its prepared state, scored, recorded,
and always cleaned up.

Owns the sandboxes it prepares and forks, and nothing else: each carries the client's run
label (so ``aenv kill --metadata run=<run id>`` cleans up after a trainer that was SIGKILLed)
and the pool's own ``rl_pool=<id>`` label (so closing one pool never touches another pool's
sandboxes on the same client).

``run(task, agent, group_size=G, reward=...)``:

Prerequisites: the pool is open (``async with pool:``).
On success: G :class:`~aenv.rl.trajectory.Trajectory` objects in order. The task is prepared
once per pool (the first run, or :meth:`RolloutPool.prepare`) and, by default, snapshotted
and paused; each child is then created from that snapshot when an agent slot is free for it
(no child waits running, no rollout waits for another), or, with ``branch_from="parent"``,
the G children come from one fork call of the running parent (``aenv.rl.branch``; children
the node refused with 429 are asked for again by the client, with backoff); at most
``max_parallel`` agents act at once; each rollout is then diffed against the prepared state
and scored; finally killed, or paused when ``keep``.
On failure: a rollout's failure is recorded on its trajectory, never raised: the agent's or
the grader's in ``error``, the platform's (fork refused, sandbox lost) in ``infra_error``.
Raised: the task's :class:`~aenv.rl.errors.SetupFailed` and usage errors (a template that
does not exist), after which nothing of the call is left running.
On cancellation (or any exception escaping): every child of the call is killed, shielded,
before the cancellation propagates; the prepared parent stays cached until the pool closes.

Closing the pool (its ``async with`` exit, also on an exception or cancellation) kills every
child still kept, every prepared parent (and deletes its snapshot), and then whatever still
carries the pool's label (a child of a fork the cancellation interrupted before its answer
arrived).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable

from aenv.client import (
    AsyncClient,
    ClientError,
    Forked,
    InfrastructureError,
    Sandbox,
)
from aenv.rl.branch import Branch, BranchFrom, children, close_branch, open_branch
from aenv.rl.diff import diff
from aenv.rl.env import Agent, RolloutEnv
from aenv.rl.reward import REWARD_TIMEOUT_S, Reward, score
from aenv.rl.task import NEVER_IDLE_PAUSE, Prepared, Task, prepare
from aenv.rl.trajectory import Trajectory

log = logging.getLogger("aenv.rl")

#: Agents acting at once per pool: each holds a sandbox busy; more than the node's cores
#: only queues in the sandboxes.
MAX_PARALLEL = 8
#: A fork child's lifetime unless the pool is told otherwise: the node ends a child whose
#: trainer vanished after this long even if nothing else cleans it up.
ROLLOUT_TIMEOUT_S = 1800
#: The pool's label key (its value: the pool's id).
POOL_LABEL = "rl_pool"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _propagate_cancellation() -> None:
    """Re-raise a cancellation that a library below turned into an ordinary error (the
    Connect client makes a cancelled request a ``ConnectError``): a cancelled rollout must
    end as cancelled, not be recorded and graded."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class RolloutPool:
    """Rollouts of prepared tasks on one client; see the module docstring and ``docs/rl.md``.

    ``max_parallel``: agents acting at once. ``keep``: the default of ``run(keep=)``.
    ``rollout_timeout_s``: each child's lifetime on the node. ``agent_timeout_s``: an agent's
    budget per rollout (past it, the rollout's ``error`` says so; None: no limit).
    ``branch_from``: children from a snapshot of the paused parent, or forks of the running
    parent (``aenv.rl.branch``)."""

    def __init__(self, client: AsyncClient, *, max_parallel: int = MAX_PARALLEL,
                 keep: bool = False, rollout_timeout_s: int = ROLLOUT_TIMEOUT_S,
                 agent_timeout_s: float | None = None,
                 reward_timeout_s: float = REWARD_TIMEOUT_S,
                 branch_from: BranchFrom = "snapshot") -> None:
        if max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        self.client = client
        self.id = uuid.uuid4().hex[:12]
        self.max_parallel = max_parallel
        self.keep = keep
        self.rollout_timeout_s = rollout_timeout_s
        self.agent_timeout_s = agent_timeout_s
        self.reward_timeout_s = reward_timeout_s
        self.branch_from: BranchFrom = branch_from
        self._gate = asyncio.Semaphore(max_parallel)
        #: Task key → its prepare, shared by concurrent callers (one sandbox per task).
        self._prepared: dict[str, asyncio.Task[Branch]] = {}
        #: Children forked and not yet killed (kept ones included), by id.
        self._live: dict[str, Sandbox] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"RolloutPool({self.id!r}, run_id={self.client.run_id!r})"

    async def __aenter__(self) -> RolloutPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def labels(self) -> dict[str, str]:
        """The labels on every sandbox of this pool (its children inherit them)."""
        return {POOL_LABEL: self.id}

    # -- prepared state --

    async def prepare(self, task: Task) -> Prepared:
        """The task's prepared parent, made on the first call and reused after; a failed
        prepare is forgotten (the next call tries again)."""
        return (await self._branch(task)).prepared

    async def _branch(self, task: Task) -> Branch:
        self._check_open()
        job = self._prepared.get(task.key)
        if job is None or (job.done() and (job.cancelled() or job.exception() is not None)):
            job = asyncio.ensure_future(self._open(task))
            self._prepared[task.key] = job
        # Shielded: one caller's cancellation must not cancel a prepare others wait for;
        # an orphaned prepare finishes and is cached, and aclose kills it.
        return await asyncio.shield(job)

    async def _open(self, task: Task) -> Branch:
        # The diff baseline is taken when a diff first needs it (``baseline.py``).
        prepared = await prepare(self.client, task, labels=self.labels, manifest=False)
        try:
            return await open_branch(prepared, self.branch_from)
        except BaseException:
            await asyncio.shield(self._kill([prepared.sandbox]))
            raise

    async def release(self, task: Task) -> None:
        """Kill the task's prepared parent now (its rollouts must be done with it)."""
        job = self._prepared.pop(task.key, None)
        if job is not None:
            await self._kill_prepared(job)

    # -- rollouts --

    async def fork(self, task: Task, count: int) -> Forked:
        """``count`` children of the task's prepared state, owned by the pool (killed on its
        exit): the primitive under ``run``, for callers with their own loop (the Gym env)."""
        self._check_open()
        return await self._fork(await self._branch(task), count)

    async def kill(self, sandbox: Sandbox) -> None:
        """Kill one of the pool's children now."""
        await self._kill([sandbox])

    async def run(self, task: Task, agent: Agent, *, group_size: int, reward: Reward,
                  keep: bool | None = None, compute_diff: bool = True) -> list[Trajectory]:
        """G rollouts of ``task`` by ``agent``, scored by ``reward``; see the module docstring."""
        if group_size < 1:
            raise ValueError("group_size must be at least 1")
        keep = self.keep if keep is None else keep
        branch = await self._branch(task)
        trajectories = [Trajectory(i) for i in range(group_size)]
        #: Every child this call started, as it starts (killed if the call fails).
        children: list[Sandbox] = []
        try:
            if branch.snapshot_id is None:
                await self._run_forked(branch, trajectories, children, agent, reward, keep,
                                       compute_diff)
            else:
                await asyncio.gather(*(
                    self._run_created(branch, trajectory, children, agent, reward, keep,
                                      compute_diff)
                    for trajectory in trajectories))
        except BaseException:
            # Shielded, so a cancelled run still kills its children before it propagates.
            await asyncio.shield(self._kill(c for c in children if c.sandbox_id in self._live))
            raise
        finally:
            await asyncio.shield(branch.baseline.rest())  # a diff may have resumed the parent
        return trajectories

    async def _run_forked(self, branch: Branch, trajectories: list[Trajectory],
                          children: list[Sandbox], agent: Agent, reward: Reward, keep: bool,
                          compute_diff: bool) -> None:
        """One fork call for every rollout; a child waits, running, for an agent slot."""
        try:
            forked = await self._fork(branch, len(trajectories))
        except InfrastructureError as exc:
            for trajectory in trajectories:
                trajectory.infra_error = _describe(exc)
            return
        children.extend(forked)
        for trajectory, child in zip(trajectories, forked, strict=False):
            trajectory.sandbox_id = child.sandbox_id
        for trajectory, error in zip(trajectories[len(forked):], forked.errors, strict=False):
            trajectory.infra_error = _describe(error)

        async def one(child: Sandbox, trajectory: Trajectory) -> None:
            async with self._gate:
                await self._act_and_grade(branch, child, trajectory, agent, reward,
                                          compute_diff)
            await self._finish(child, trajectory, keep)

        await asyncio.gather(*(one(c, t) for c, t in zip(forked, trajectories, strict=False)))

    async def _run_created(self, branch: Branch, trajectory: Trajectory,
                           children: list[Sandbox], agent: Agent, reward: Reward, keep: bool,
                           compute_diff: bool) -> None:
        """One rollout whose child is created from the snapshot once an agent slot is free:
        no child waits running for a slot, and no rollout waits for another's start."""
        async with self._gate:
            try:
                started = await self._fork(branch, 1)
            except InfrastructureError as exc:
                trajectory.infra_error = _describe(exc)
                return
            if not started:
                trajectory.infra_error = (_describe(started.errors[0]) if started.errors
                                          else "the node started no child")
                return
            child = started[0]
            children.append(child)
            trajectory.sandbox_id = child.sandbox_id
            await self._act_and_grade(branch, child, trajectory, agent, reward, compute_diff)
        await self._finish(child, trajectory, keep)

    async def _fork(self, branch: Branch, count: int) -> Forked:
        task = branch.prepared.task
        forked = await children(self.client, branch, count, timeout=self.rollout_timeout_s,
                                metadata={**NEVER_IDLE_PAUSE, **self.labels,
                                          "rl_task": task.key})
        for child in forked:
            self._live[child.sandbox_id] = child
        return forked

    async def _act_and_grade(self, branch: Branch, child: Sandbox, trajectory: Trajectory,
                             agent: Agent, reward: Reward, compute_diff: bool) -> None:
        """The agent on ``child``, then the diff and the reward (inside the caller's slot)."""
        env = RolloutEnv(child, branch.prepared.task.workdir, index=trajectory.index)
        trajectory.steps = env.steps  # the same list: steps recorded even if the agent hangs
        start = time.monotonic()
        try:
            async with asyncio.timeout(self.agent_timeout_s):
                await agent.act(env)
        except InfrastructureError as exc:
            _propagate_cancellation()
            trajectory.infra_error = _describe(exc)
        except TimeoutError:
            trajectory.error = f"TimeoutError: the agent ran past {self.agent_timeout_s} s"
        except Exception as exc:
            _propagate_cancellation()
            trajectory.error = _describe(exc)
        trajectory.timings["agent"] = time.monotonic() - start
        if trajectory.infra_error is None:
            await self._grade(branch, env, trajectory, reward, compute_diff)

    async def _grade(self, branch: Branch, env: RolloutEnv, trajectory: Trajectory,
                     reward: Reward, compute_diff: bool) -> None:
        """Diff first (the agent's change, before the grader writes byte-code or logs), then
        the reward. A failure is recorded, by whose fault it was."""
        try:
            if compute_diff:
                start = time.monotonic()
                prepared = branch.prepared
                trajectory.diff = await diff(branch.baseline, await branch.baseline.manifest(),
                                             env.sandbox, prepared.task.roots)
                trajectory.timings["diff"] = time.monotonic() - start
            start = time.monotonic()
            trajectory.reward, trajectory.reward_step = await score(
                reward, env, timeout=self.reward_timeout_s)
            trajectory.timings["reward"] = time.monotonic() - start
        except InfrastructureError as exc:
            trajectory.infra_error = _describe(exc)
            trajectory.reward = None
        except Exception as exc:
            trajectory.error = trajectory.error or f"reward: {_describe(exc)}"

    async def _finish(self, child: Sandbox, trajectory: Trajectory, keep: bool) -> None:
        """Pause a kept rollout (an idle one costs no CPU and, paged out, little memory);
        kill the rest. A pause that fails kills: nothing half-kept."""
        if keep and trajectory.infra_error is None:
            try:
                await child.pause()
            except ClientError as exc:
                log.info("pool %s: pausing %s failed (%s); killing it", self.id,
                         child.sandbox_id, exc)
            else:
                trajectory.kept = True
                return
        await self._kill([child])

    # -- cleanup --

    async def aclose(self) -> None:
        """Kill every sandbox of the pool (kept rollouts, prepared parents, orphans)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        jobs = list(self._prepared.values())
        self._prepared.clear()
        await asyncio.gather(self._kill(list(self._live.values())),
                             *(self._kill_prepared(job) for job in jobs))
        try:
            await self.client.kill_by_metadata(**self.labels)
        except ClientError as exc:
            log.warning("pool %s: the sweep by label failed: %s", self.id, exc)

    async def _kill_prepared(self, job: asyncio.Task[Branch]) -> None:
        if not job.done():
            job.cancel()  # prepare kills its own sandbox when cancelled
        # Waited, not awaited: the job's own cancellation or failure is not ours to raise.
        await asyncio.wait([job])
        if not job.cancelled() and job.exception() is None:
            await close_branch(self.client, job.result())

    async def _kill(self, sandboxes: Iterable[Sandbox]) -> None:
        async def one(sandbox: Sandbox) -> None:
            try:
                await self.client.kill(sandbox.sandbox_id)
            except ClientError as exc:  # the labels and the node's timeout still bound it
                log.warning("pool %s: killing %s failed: %s", self.id, sandbox.sandbox_id, exc)
            self._live.pop(sandbox.sandbox_id, None)

        await asyncio.gather(*(one(s) for s in list(sandboxes)))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the rollout pool is closed")

