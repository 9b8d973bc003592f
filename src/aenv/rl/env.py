"""``RolloutEnv``: what an agent sees of its rollout sandbox, every call recorded as a step.

The agent acts only through this object (``run``, ``write_file``, ``read_file``, ``edit``), so
the trajectory is complete by construction: each call appends a :class:`Step` with the action,
its output, exit code and duration, whether it succeeded, failed or raised. Infrastructure
errors (``SandboxLost`` …) propagate unchanged for the pool to record apart from the task's
outcome; they are recorded on the step too (``error``) so the trajectory shows where it broke.

Relative paths are relative to the task's ``workdir``, and so is a command's default ``cwd``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

from e2b import AsyncSandbox

from aenv.client import ClientError, CommandResult, Sandbox
from aenv.rl.errors import EditFailed

#: A step's time limit unless the agent gives one: the client's own default.
STEP_TIMEOUT_S = 60.0

StepKind = Literal["run", "write", "read", "edit"]


@dataclass(frozen=True)
class Step:
    """One action of an agent and what came of it.

    ``output``: a command's stdout followed by its stderr; a read's text; an edit's or a
    write's error message (empty on success). ``exit_code``: the command's, or 0/1 for file
    actions. ``error``: the exception that ended the step, if one did (``Type: message``)."""

    kind: StepKind
    action: str
    output: str
    exit_code: int
    duration_s: float
    error: str | None = None


class RolloutEnv:
    """One rollout's sandbox as the agent sees it; see the module docstring."""

    def __init__(self, sandbox: Sandbox, workdir: str, *, index: int = 0) -> None:
        self.sandbox = sandbox
        self.workdir = workdir.rstrip("/") or "/"
        #: Which rollout of its group this is (0 … G-1): a scripted agent may branch on it.
        self.index = index
        self.steps: list[Step] = []

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.sandbox_id

    @property
    def sdk(self) -> AsyncSandbox:
        """The e2b SDK sandbox, for what is not wrapped here (such calls are not recorded)."""
        return self.sandbox.sdk

    def path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.workdir}/{path}"

    async def run(self, cmd: str, *, timeout: float | None = STEP_TIMEOUT_S,
                  cwd: str | None = None) -> CommandResult:
        """Run ``cmd`` (``bash -l -c``) in ``cwd`` (default: the workdir). A non-zero exit is
        a result; a timeout raises ``SandboxTimeout`` (the task's doing)."""
        start = time.monotonic()
        try:
            result = await self.sandbox.run(cmd, timeout=timeout,
                                            cwd=self.path(cwd) if cwd else self.workdir)
        except ClientError as exc:
            self._record("run", cmd, "", -1, start, exc)
            raise
        self._record("run", cmd, result.stdout + result.stderr, result.exit_code, start)
        return result

    async def write_file(self, path: str, data: str | bytes) -> None:
        start = time.monotonic()
        try:
            await self.sandbox.write_file(self.path(path), data)
        except ClientError as exc:
            self._record("write", self.path(path), str(exc), 1, start, exc)
            raise
        self._record("write", self.path(path), "", 0, start)

    async def read_file(self, path: str) -> str:
        start = time.monotonic()
        try:
            text = await self.sandbox.read_file(self.path(path))
        except ClientError as exc:
            self._record("read", self.path(path), str(exc), 1, start, exc)
            raise
        self._record("read", self.path(path), text, 0, start)
        return text

    async def edit(self, path: str, old: str, new: str) -> None:
        """Replace the one occurrence of ``old`` in ``path`` by ``new`` (a str_replace edit).

        On failure: :class:`EditFailed` when ``old`` occurs zero or several times (the file
        is left as it was); the client's errors (``NotFound`` for a missing file)."""
        start = time.monotonic()
        action = f"{self.path(path)}: {old!r} -> {new!r}"
        try:
            text = await self.sandbox.read_file(self.path(path))
            count = text.count(old)
            if count != 1:
                raise EditFailed(f"edit {self.path(path)}: the old text occurs {count} times, "
                                 f"not once", sandbox_id=self.sandbox_id)
            await self.sandbox.write_file(self.path(path), text.replace(old, new, 1))
        except ClientError as exc:
            self._record("edit", action, str(exc), 1, start, exc)
            raise
        self._record("edit", action, "", 0, start)

    def _record(self, kind: StepKind, action: str, output: str, exit_code: int, start: float,
                exc: BaseException | None = None) -> None:
        error = f"{type(exc).__name__}: {exc}" if exc is not None else None
        self.steps.append(Step(kind, action, output, exit_code, time.monotonic() - start, error))


class Agent(Protocol):
    """What the pool runs on each rollout: act on the env until done, then return."""

    async def act(self, env: RolloutEnv) -> None: ...
