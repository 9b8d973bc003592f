"""Scoring a rollout: a shell command run in the rollout, or a Python callable.

A **command** is the usual grader of SWE-style tasks (``python3 -m unittest``, ``pytest -q``,
a script): it runs in the task's workdir after the agent is done; if the last non-empty line
of its stdout is a number, that number is the reward, else the exit code decides (0 → 1.0,
anything else → 0.0). A **callable** gets the :class:`~aenv.rl.env.RolloutEnv` and returns a
float (or an awaitable of one), for rewards computed on this side (a diff, an LLM judge).

The grader's own run is not an agent step: it is recorded on the trajectory apart
(``Trajectory.reward_step``), so a trainer can tell what the agent did from how it was scored.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable

from aenv.rl.env import RolloutEnv, Step

#: A grader's time limit: a test suite, not an install.
REWARD_TIMEOUT_S = 300.0

RewardFn = Callable[[RolloutEnv], float | Awaitable[float]]
Reward = str | RewardFn


def parse_reward(stdout: str, exit_code: int) -> float:
    """The reward a command's output means (see the module docstring)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            pass
        else:
            if math.isfinite(value):
                return value
    return 1.0 if exit_code == 0 else 0.0


async def score(reward: Reward, env: RolloutEnv, *, timeout: float = REWARD_TIMEOUT_S
                ) -> tuple[float, Step | None]:
    """The rollout's reward, and the grader command's step (None for a callable).

    On failure: the client's errors for a command (``SandboxTimeout`` past ``timeout``,
    ``SandboxLost``); whatever a callable raises."""
    if isinstance(reward, str):
        start = time.monotonic()
        result = await env.sandbox.run(reward, cwd=env.workdir, timeout=timeout)
        step = Step("run", reward, result.stdout + result.stderr, result.exit_code,
                    time.monotonic() - start)
        return parse_reward(result.stdout, result.exit_code), step
    value = reward(env)
    if inspect.isawaitable(value):
        value = await value
    return float(value), None
