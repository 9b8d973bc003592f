"""The errors of ``aenv.client``, split by whose fault they are.

A trainer that runs thousands of rollouts must keep infrastructure failures out of the reward:
a sandbox that died, a node that refused or did not answer, says nothing about the agent. So
every error belongs to exactly one of three branches, and each branch says what to do::

    ClientError
    ├── InfrastructureError     not the task's fault: retry the rollout (elsewhere, later)
    │   ├── Unavailable         the node did not answer, or answered 5xx / 503 past the deadline
    │   ├── CapacityError       429 (node at its admission or sandbox limit) past the deadline
    │   └── SandboxLost         a sandbox we hold is gone: killed, died, timed out, unreachable
    ├── TaskError               what the code in the sandbox did: part of the rollout's outcome
    │   ├── CommandFailed       non-zero exit of ``run(..., check=True)``; carries the result
    │   └── SandboxTimeout      a command ran past its ``timeout``
    └── UsageError              the call or the configuration is wrong: fix it, do not retry
        ├── Unauthenticated     401: no or a wrong API key
        ├── TemplateNotFound    create from a template the node does not have
        ├── NotFound            a snapshot (or other named thing) that does not exist
        ├── Conflict            409: e.g. pause a paused sandbox, fork one that is busy
        └── InvalidRequest      400 and every other 4xx

``error.infrastructure`` is True exactly on the first branch, for code that prefers an attribute
to ``isinstance``. Errors are raised ``from`` the foreign exception (httpx, e2b) they convert.
This module imports nothing: it is the leaf of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aenv.client.sandbox import CommandResult


class ClientError(Exception):
    """Root of every error ``aenv.client`` raises."""

    #: True for failures of the infrastructure (never the task's doing).
    infrastructure: bool = False

    def __init__(self, message: str, *, status: int | None = None,
                 sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: The HTTP status the node answered with, if it answered.
        self.status = status
        #: The sandbox the failed call was about, if any.
        self.sandbox_id = sandbox_id


# -- infrastructure --

class InfrastructureError(ClientError):
    """Not the task's fault; the same rollout may well succeed on a retry."""

    infrastructure = True


class Unavailable(InfrastructureError):
    """The node could not be reached, timed out, or failed (5xx)."""


class CapacityError(InfrastructureError):
    """The node kept refusing for lack of room (429) until the client's deadline passed."""

    def __init__(self, message: str, *, status: int | None = 429,
                 sandbox_id: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, status=status, sandbox_id=sandbox_id)
        #: The node's last ``Retry-After``, in seconds (None: it sent none).
        self.retry_after_s = retry_after_s


class SandboxLost(InfrastructureError):
    """A sandbox this client created or connected to is gone (404) or cannot be reached."""


# -- the task --

class TaskError(ClientError):
    """The outcome of the task's own code: keep it in the rollout's result."""


class CommandFailed(TaskError):
    """``run(..., check=True)`` exited non-zero; ``result`` holds its output."""

    def __init__(self, message: str, result: CommandResult, *, sandbox_id: str | None = None
                 ) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.result = result

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


class SandboxTimeout(TaskError):
    """A command ran past its ``timeout`` (the process in the sandbox was ended)."""


# -- usage --

class UsageError(ClientError):
    """The request or the configuration is wrong; retrying the same call will not help."""


class Unauthenticated(UsageError):
    """No API key, or one the node does not accept (401)."""


class TemplateNotFound(UsageError):
    """The node has no template of that name or id."""


class NotFound(UsageError):
    """A snapshot, or another named thing that is not a sandbox we hold, does not exist."""


class Conflict(UsageError):
    """The sandbox is not in a state for this operation (409)."""


class InvalidRequest(UsageError):
    """The node refused the request's arguments (400, or another 4xx)."""
