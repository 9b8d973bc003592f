"""The one exception tree of aenv.

Every error a user can see is an :class:`AenvError`. Each class knows the HTTP status and the
Connect code it is rendered with, so no route or RPC handler builds an error body by hand::

    AenvError
    ├── InvalidArgument        400  invalid_argument
    ├── Unauthenticated        401  unauthenticated
    ├── PermissionDenied       403  permission_denied
    ├── NotFound               404  not_found
    ├── AlreadyExists          409  already_exists
    ├── Conflict               409  aborted
    ├── FailedPrecondition     400  failed_precondition
    ├── ResourceExhausted      429  resource_exhausted
    │   └── NotEnoughSpace     507  resource_exhausted
    ├── Unavailable            503  unavailable
    ├── Unimplemented          501  unimplemented
    ├── DeadlineExceeded       504  deadline_exceeded  a command in a sandbox ran too long
    ├── Internal               500  internal
    │   └── DataLoss           500  data_loss     stored bytes do not match their digest
    ├── RuntimeFailure         500  internal      a sandbox runtime (runsc …) failed
    └── CommandError           500  internal      an external command failed
        └── CommandTimeout     504  deadline_exceeded
"""

from __future__ import annotations

from collections.abc import Sequence


class AenvError(Exception):
    """Root of every aenv error."""

    http_status: int = 500
    connect_code: str = "internal"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: A machine-readable cause where an API names one (the volume content API's
        #: ``CANNOT_DELETE_ROOT``...); None: the status says it all.
        self.reason = reason


class InvalidArgument(AenvError):
    http_status = 400
    connect_code = "invalid_argument"


class Unauthenticated(AenvError):
    http_status = 401
    connect_code = "unauthenticated"


class PermissionDenied(AenvError):
    http_status = 403
    connect_code = "permission_denied"


class NotFound(AenvError):
    http_status = 404
    connect_code = "not_found"


class AlreadyExists(AenvError):
    http_status = 409
    connect_code = "already_exists"


class Conflict(AenvError):
    http_status = 409
    connect_code = "aborted"


class FailedPrecondition(AenvError):
    http_status = 400
    connect_code = "failed_precondition"


class ResourceExhausted(AenvError):
    http_status = 429
    connect_code = "resource_exhausted"

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        #: Whole seconds a client should wait before trying again, sent as ``Retry-After``
        #: (the E2B SDKs honour it on a 429); None: no such header.
        self.retry_after_s = retry_after_s


class QuotaExceeded(ResourceExhausted):
    """A team's quota (``orchestrator/team_quota.py``), the same on every node of a
    cluster: a gateway does not try the start on another node."""


class NotEnoughSpace(ResourceExhausted):
    http_status = 507


class Unavailable(AenvError):
    http_status = 503
    connect_code = "unavailable"


class Unimplemented(AenvError):
    http_status = 501
    connect_code = "unimplemented"


class DeadlineExceeded(AenvError):
    """An operation inside a sandbox (a build step, a ready check) ran past its time."""

    http_status = 504
    connect_code = "deadline_exceeded"


class Internal(AenvError):
    http_status = 500
    connect_code = "internal"


class DataLoss(Internal):
    """Stored bytes (a repository blob, a cached file) do not match the digest that names them."""

    connect_code = "data_loss"


class RuntimeFailure(AenvError):
    """A sandbox runtime (runsc, Firecracker) failed an operation; the message carries its words.

    Raised by drivers at their one conversion boundary (``map_runsc_errors``), chained to the
    :class:`CommandError` that caused it.
    """

    http_status = 500
    connect_code = "internal"


class InDoubt(RuntimeFailure):
    """A runtime call got no answer, or was cut short: it may or may not have taken effect
    (e.g. a pause over runsc's control socket). The caller settles the sandbox another way.
    To a client it is 503: the sandbox's runtime is not answering now (not the node's bug, and
    worth a retry), not a 500."""

    http_status = 503
    connect_code = "unavailable"


class CommandError(AenvError):
    """An external command exited non-zero (or could not start)."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        shown = " ".join(argv)
        tail = stderr.strip()[-2000:]
        super().__init__(f"command {shown!r} failed ({returncode}): {tail}")
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class CommandTimeout(CommandError):
    http_status = 504
    connect_code = "deadline_exceeded"


def all_error_classes() -> list[type[AenvError]]:
    """Every class of the tree (used by the test that each one is mapped)."""
    found: list[type[AenvError]] = []
    pending: list[type[AenvError]] = [AenvError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
