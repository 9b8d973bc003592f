"""The environment server: ``uvicorn server.app:app`` in the template's ``/app``.

The task (question and answer) is ``/app/task.json``, baked into the template, so each
template is one task. An episode: ``reset`` gives the question; each ``step`` answers it,
reward 1.0 and done when right, 0.0 otherwise; done after ``MAX_STEPS`` answers either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import uuid4

from models import AnswerAction, QuestionObservation
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

TASK = json.loads(Path(__file__).resolve().parents[1].joinpath("task.json").read_text())
MAX_STEPS = 3


class QuestionEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> QuestionObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return QuestionObservation(question=TASK["question"], done=False, reward=0.0)

    def step(self, action: AnswerAction, timeout_s: float | None = None,  # type: ignore[override]
             **kwargs: Any) -> QuestionObservation:
        self._state.step_count += 1
        correct = action.answer.strip() == TASK["answer"]
        return QuestionObservation(question=TASK["question"], correct=correct,
                                   done=correct or self._state.step_count >= MAX_STEPS,
                                   reward=1.0 if correct else 0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(QuestionEnvironment, AnswerAction, QuestionObservation,
                 env_name="question", max_concurrent_envs=4)
