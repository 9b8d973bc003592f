"""The errors ``aenv.rl`` adds to ``aenv.client``'s tree, on the branch of whose fault they are.

::

    aenv.client.TaskError
    ├── SetupFailed     a task's setup command exited non-zero (the prepared sandbox is killed)
    └── EditFailed      ``RolloutEnv.edit``: the old text is absent or not unique

Both are the task's (or the agent's) doing, never the infrastructure's, so they sit under
``TaskError``: a trainer that keeps ``InfrastructureError`` out of the reward keeps these in.
"""

from __future__ import annotations

from aenv.client import CommandResult, TaskError


class SetupFailed(TaskError):
    """A setup command of a task failed; ``command`` and ``result`` say which and how."""

    def __init__(self, message: str, command: str, result: CommandResult, *,
                 sandbox_id: str | None = None) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.command = command
        self.result = result


class EditFailed(TaskError):
    """``edit(path, old, new)`` found ``old`` zero times or more than once in ``path``."""
