"""``Trajectory``: the record of one rollout, the unit a trainer consumes.

Two kinds of failure are kept apart on purpose. ``error`` is the rollout's own outcome (the
agent raised, timed out, its edit did not apply, the grader callable failed): part of the
data, scored like any other outcome. ``infra_error`` is the platform's (the fork refused,
the sandbox lost, the node unreachable): the rollout says nothing about the agent, so
:attr:`Trajectory.scored` is False and a trainer should drop or retry it, never feed its
reward (None) to the learner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aenv.rl.diff import Diff
from aenv.rl.env import Step


@dataclass
class Trajectory:
    #: The rollout's place in its group, 0 … G-1.
    index: int
    #: The fork child it ran in (None when the fork did not start it).
    sandbox_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    reward: float | None = None
    #: The grader command's run (None for a callable reward, or when not scored).
    reward_step: Step | None = None
    diff: Diff | None = None
    #: The task's side: the agent (or a reward callable) raised: ``Type: message``.
    error: str | None = None
    #: The platform's side: keep this rollout out of the reward.
    infra_error: str | None = None
    #: Seconds spent: ``agent``, ``diff``, ``reward``.
    timings: dict[str, float] = field(default_factory=dict)
    #: The sandbox was kept (paused) rather than killed; the pool still kills it on exit.
    kept: bool = False

    @property
    def scored(self) -> bool:
        """A reward the learner may use: no infrastructure failure got in the way."""
        return self.infra_error is None and self.reward is not None
