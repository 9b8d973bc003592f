"""Gymnasium-style envs over a task's prepared state: ``reset`` starts a child, ``step`` runs a
command.

``reset()`` kills the previous episode's sandbox and starts a fresh child of the prepared
state (the pool's ``branch_from``), so every episode starts from exactly the prepared state,
at the cost of a restore rather than a setup. The observation at reset is the task's
``prompt``; a step's action is a shell command, run in the task's workdir, and its
observation the command's stdout and stderr (cut to ``max_observation_chars``). The action
``submit`` ends the episode (``terminated``), and its reward is the task's grade (a command
or callable, as for the pool); other steps are worth 0. ``max_steps`` truncates an episode.

Infrastructure errors (``SandboxLost`` …) are raised, not folded into a reward: Gym's
``step`` has no slot for "this episode says nothing", and a silent 0 would train on it.

:class:`AsyncSandboxEnv` is the async env; :class:`SandboxEnv` runs it on the private loop of a
sync client (``aenv.client.sync.Client``), usable from threads and Ray actors, and subclasses
``gymnasium.Env`` with ``spaces.Text`` spaces when ``gymnasium`` is installed (a plain class
with the same API otherwise).
"""

from __future__ import annotations

import string
from typing import Any

from aenv.client import AsyncClient, Sandbox, SandboxTimeout
from aenv.client.sync import Client
from aenv.rl.env import STEP_TIMEOUT_S, RolloutEnv
from aenv.rl.pool import RolloutPool
from aenv.rl.reward import Reward, score
from aenv.rl.sync import RolloutPool as SyncRolloutPool
from aenv.rl.task import Task

try:
    import gymnasium
    from gymnasium import spaces
except ImportError:  # the env works without it; it just is not a gymnasium.Env then
    gymnasium = None  # type: ignore[assignment]
    spaces = None  # type: ignore[assignment]

#: An observation's cut: a command's output past this is of no use to a policy's context.
MAX_OBSERVATION_CHARS = 8192
#: An action's longest text (Gym's ``Text`` space needs a bound).
MAX_ACTION_CHARS = 4096
#: What actions and observations are made of: printable ASCII and whitespace. Other
#: characters of an observation become ``?`` so it stays in its ``Text`` space.
CHARSET = string.printable
SUBMIT = "submit"

Info = dict[str, Any]


def _clean(text: str, limit: int) -> str:
    allowed = set(CHARSET)
    text = "".join(c if c in allowed else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 15] + "\n...[truncated]"


class AsyncSandboxEnv:
    """The async env; see the module docstring.

    ``source``: a client (the env then makes and closes a pool of its own) or a
    :class:`~aenv.rl.pool.RolloutPool` (shared: its prepared parent serves every env on it)."""

    def __init__(self, task: Task, source: AsyncClient | RolloutPool, *,
                 reward: Reward | None = None, max_steps: int | None = None,
                 max_observation_chars: int = MAX_OBSERVATION_CHARS,
                 step_timeout_s: float = STEP_TIMEOUT_S, submit_action: str = SUBMIT) -> None:
        self.task = task
        self._own_pool = isinstance(source, AsyncClient)
        self.pool = RolloutPool(source) if isinstance(source, AsyncClient) else source
        self.reward = reward
        self.max_steps = max_steps
        self.max_observation_chars = max_observation_chars
        self.step_timeout_s = step_timeout_s
        self.submit_action = submit_action
        self._child: Sandbox | None = None
        self._env: RolloutEnv | None = None
        self._done = False

    @property
    def rollout(self) -> RolloutEnv | None:
        """The current episode's env (its ``steps`` are the episode's trajectory)."""
        return self._env

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
                    ) -> tuple[str, Info]:
        """A fresh episode: the previous child killed, a new one forked.
        ``seed`` and ``options`` are accepted for Gym's sake; a sandbox has no seed."""
        await self._end_episode()
        [child] = await self.pool.fork(self.task, 1)
        self._child = child
        self._env = RolloutEnv(child, self.task.workdir)
        self._done = False
        return _clean(self.task.prompt, self.max_observation_chars), {
            "sandbox_id": child.sandbox_id}

    async def step(self, action: str) -> tuple[str, float, bool, bool, Info]:
        """Run ``action``; ``(observation, reward, terminated, truncated, info)``."""
        if self._env is None or self._done:
            raise RuntimeError("step() before reset(), or after the episode ended")
        env = self._env
        # No sandbox id here: Gym's checker wants a step's info to be a function of the seed
        # and the action (``reset``'s info and ``rollout.sandbox_id`` have it).
        info: Info = {}
        if action.strip() == self.submit_action:
            self._done = True
            if self.reward is None:
                return "", 0.0, True, False, info
            value, grader = await score(self.reward, env)
            info["exit_code"] = grader.exit_code if grader else None
            output = grader.output if grader else ""
            return _clean(output, self.max_observation_chars), value, True, False, info
        try:
            result = await env.run(action, timeout=self.step_timeout_s)
            output, info["exit_code"] = result.stdout + result.stderr, result.exit_code
        except SandboxTimeout:  # the action's doing: an observation, not an error
            output, info["exit_code"] = f"timed out after {self.step_timeout_s} s", -1
        truncated = self.max_steps is not None and len(env.steps) >= self.max_steps
        self._done = truncated
        return _clean(output, self.max_observation_chars), 0.0, False, truncated, info

    async def close(self) -> None:
        """Kill the episode's sandbox (and the pool, when the env made it)."""
        await self._end_episode()
        if self._own_pool:
            await self.pool.aclose()

    async def _end_episode(self) -> None:
        child, self._child, self._env = self._child, None, None
        if child is not None:
            await self.pool.kill(child)


_Base: Any = gymnasium.Env if gymnasium is not None else object


class SandboxEnv(_Base):  # type: ignore[misc]
    """The sync env (a ``gymnasium.Env`` when gymnasium is installed); see the module
    docstring. ``source``: an ``aenv.client.sync.Client`` or an ``aenv.rl.sync.RolloutPool``;
    the other arguments as :class:`AsyncSandboxEnv`'s."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, task: Task, source: Client | SyncRolloutPool, **options: Any) -> None:
        super().__init__()
        self.client = source.client if isinstance(source, SyncRolloutPool) else source
        self.aio = AsyncSandboxEnv(task, source.aio, **options)
        if spaces is not None:
            self.action_space = spaces.Text(max_length=MAX_ACTION_CHARS, charset=CHARSET)
            self.observation_space = spaces.Text(max_length=self.aio.max_observation_chars,
                                                 min_length=0, charset=CHARSET)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, Info]:
        if gymnasium is not None:
            super().reset(seed=seed)  # seeds np_random, which the spaces' sample() uses
        return self.client.run_async(self.aio.reset(seed=seed, options=options))

    def step(self, action: str) -> tuple[str, float, bool, bool, Info]:
        return self.client.run_async(self.aio.step(action))

    def close(self) -> None:
        self.client.run_async(self.aio.close())
