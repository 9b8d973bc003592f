"""The rollout pool for code without an event loop (threads, Ray actors, scripts).

A facade over :class:`aenv.rl.pool.RolloutPool` on the private event loop of an
:class:`aenv.client.sync.Client` (``Client.run_async``): the same loop the client's
sandboxes live on, so nothing here starts a loop or a thread of its own. Any number of
threads may call one pool at once.

Agents: an agent whose ``act`` is a coroutine function runs on the loop as in the async pool.
A plain ``def act(env)`` runs in a worker thread (``asyncio.to_thread``) with a
:class:`SyncRolloutEnv`, whose calls hop back onto the loop; such an agent cannot be
interrupted half-way by a cancellation (a thread cannot be), only between its calls.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Protocol

from aenv.client import CommandResult
from aenv.client.sync import Client
from aenv.rl.env import STEP_TIMEOUT_S, Agent, RolloutEnv, Step
from aenv.rl.pool import RolloutPool as AsyncRolloutPool
from aenv.rl.reward import Reward
from aenv.rl.task import Prepared, Task
from aenv.rl.trajectory import Trajectory


class SyncRolloutEnv:
    """:class:`~aenv.rl.env.RolloutEnv` without ``await``, for agents running in a thread."""

    def __init__(self, env: RolloutEnv, client: Client) -> None:
        self.aio = env
        self._client = client

    @property
    def index(self) -> int:
        return self.aio.index

    @property
    def workdir(self) -> str:
        return self.aio.workdir

    @property
    def steps(self) -> list[Step]:
        return self.aio.steps

    def run(self, cmd: str, *, timeout: float | None = STEP_TIMEOUT_S,
            cwd: str | None = None) -> CommandResult:
        return self._client.run_async(self.aio.run(cmd, timeout=timeout, cwd=cwd))

    def write_file(self, path: str, data: str | bytes) -> None:
        self._client.run_async(self.aio.write_file(path, data))

    def read_file(self, path: str) -> str:
        return self._client.run_async(self.aio.read_file(path))

    def edit(self, path: str, old: str, new: str) -> None:
        self._client.run_async(self.aio.edit(path, old, new))


class SyncAgent(Protocol):
    def act(self, env: SyncRolloutEnv) -> None: ...


class _InThread:
    """An async agent that runs a sync one in a worker thread."""

    def __init__(self, agent: SyncAgent, client: Client) -> None:
        self._agent = agent
        self._client = client

    async def act(self, env: RolloutEnv) -> None:
        await asyncio.to_thread(self._agent.act, SyncRolloutEnv(env, self._client))


class RolloutPool:
    """The sync face of :class:`aenv.rl.pool.RolloutPool`; ``with`` closes it (kills all).

    ``client``: an :class:`aenv.client.sync.Client`; the other arguments as the async pool's."""

    def __init__(self, client: Client, **options: Any) -> None:
        self.client = client
        self.aio = client.run_async(_make(client, options))

    def __repr__(self) -> str:
        return f"sync.{self.aio!r}"

    def __enter__(self) -> RolloutPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare(self, task: Task) -> Prepared:
        return self.client.run_async(self.aio.prepare(task))

    def release(self, task: Task) -> None:
        self.client.run_async(self.aio.release(task))

    def run(self, task: Task, agent: Agent | SyncAgent, *, group_size: int, reward: Reward,
            keep: bool | None = None, compute_diff: bool = True) -> list[Trajectory]:
        wrapped: Agent = (agent if inspect.iscoroutinefunction(agent.act)  # type: ignore[assignment]
                          else _InThread(agent, self.client))  # type: ignore[arg-type]
        return self.client.run_async(self.aio.run(task, wrapped, group_size=group_size,
                                                  reward=reward, keep=keep,
                                                  compute_diff=compute_diff))

    def close(self) -> None:
        self.client.run_async(self.aio.aclose())


async def _make(client: Client, options: dict[str, Any]) -> AsyncRolloutPool:
    # Made on the client's loop, where its semaphore and tasks will live.
    return AsyncRolloutPool(client.aio, **options)
