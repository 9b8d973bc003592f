"""The id of the request a piece of work is for (docs/deployment.md, "Logs"): taken from a
caller's ``X-Request-Id`` (or made) at the edge of the node's API and of the gateway, sent by
the gateway to the node, and carried by every task the request starts (asyncio copies the
context into them), so that one call can be followed from the gateway to the node to the
operation in the logs."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

HEADER = "x-request-id"
#: What a caller's id may be; anything else is replaced by one of ours.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

current: ContextVar[str | None] = ContextVar("aenv_request_id", default=None)


def accepted(given: str | None) -> str:
    """The caller's id if it is one we keep, else a new one."""
    if given is not None and _ACCEPTED.match(given):
        return given
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on every record (``request_id``; None outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current.get()
        return True
