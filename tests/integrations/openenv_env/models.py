"""The environment's wire types, shared by the server (in the sandbox) and the client."""

from __future__ import annotations

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class AnswerAction(Action):
    """An answer to the task's question."""

    answer: str = Field(..., description="the answer")


class QuestionObservation(Observation):
    """The task's question, and whether the last answer was right."""

    question: str = Field(default="")
    correct: bool = Field(default=False)
