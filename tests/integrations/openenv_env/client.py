"""The environment's client: OpenEnv's ``EnvClient`` with this env's payloads."""

from __future__ import annotations

from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from tests.integrations.openenv_env.models import AnswerAction, QuestionObservation


class QuestionEnv(EnvClient[AnswerAction, QuestionObservation, State]):
    def _step_payload(self, action: AnswerAction) -> dict[str, Any]:
        return {"answer": action.answer}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[QuestionObservation]:
        obs = payload.get("observation", {})
        observation = QuestionObservation(
            question=obs.get("question", ""), correct=obs.get("correct", False),
            done=payload.get("done", False), reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(episode_id=payload.get("episode_id"),
                     step_count=payload.get("step_count", 0))
