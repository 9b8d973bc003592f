"""``aenv.rl``: rollouts for RL trainers on ``aenv.client``. Prepare a task once, fork G
rollouts from it, run an agent on each, score them, and collect trajectories with diffs.
Everything is cleaned up at the end. See ``docs/rl.md``.

The modules, one job each:

- ``task``: a task and its prepared parent;
- ``env``: what an agent sees, every call recorded as a step;
- ``reward``: command or callable graders;
- ``branch``: where rollouts start (a snapshot of the paused parent, or forks);
- ``baseline``: the paused parent's files, for diffs;
- ``diff``: a rollout's files against its prepared state;
- ``trajectory``: the record of one rollout;
- ``pool``: the async rollout pool;
- ``gym``: Gymnasium-style envs;
- ``sync``: the pool for threads, on the sync client's loop.

This package imports ``aenv.client`` and no other aenv package (an import-linter contract in
``pyproject.toml``): a trainer needs no node code to use it.
"""

from aenv.rl.diff import Diff, FileChange, FileEntry, Manifest
from aenv.rl.env import Agent, RolloutEnv, Step
from aenv.rl.errors import EditFailed, SetupFailed
from aenv.rl.pool import RolloutPool
from aenv.rl.reward import Reward, parse_reward
from aenv.rl.task import Prepared, Task, prepare
from aenv.rl.trajectory import Trajectory

__all__ = [
    "Agent",
    "Diff",
    "EditFailed",
    "FileChange",
    "FileEntry",
    "Manifest",
    "Prepared",
    "Reward",
    "RolloutEnv",
    "RolloutPool",
    "SetupFailed",
    "Step",
    "Task",
    "Trajectory",
    "parse_reward",
    "prepare",
]
