"""The one check of a sandbox timeout (seconds until the TTL loop pauses or kills it).

Every place that takes a timeout from a client goes through here: create (v1, v2, cold),
connect and resume, set-timeout and refresh, fork. The message is pinned by tests and read by
people, so it is written once. The wire models reject a negative number before this runs (a
400 naming the field, ``api/schemas.py``'s ``TimeoutSeconds``); the lower bound is checked
here too for callers that are not the API.
"""

from __future__ import annotations

from aenv.core.errors import InvalidArgument
from aenv.core.settings import Settings


def check_timeout(settings: Settings, seconds: int) -> int:
    """``seconds`` if it lies in ``0..max_timeout_s``; else :class:`InvalidArgument` (400)."""
    if seconds < 0:
        raise InvalidArgument(f"timeout {seconds}s is negative")
    if seconds > settings.max_timeout_s:
        raise InvalidArgument(
            f"timeout {seconds}s exceeds the maximum of {settings.max_timeout_s}s")
    return seconds


def timeout_or_default(settings: Settings, seconds: int | None) -> int:
    """The timeout asked for, or the node's ``default_timeout_s``; checked either way."""
    return check_timeout(settings, settings.default_timeout_s if seconds is None else seconds)
