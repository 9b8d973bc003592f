"""When to try again: exponential backoff with jitter, ``Retry-After``, one overall deadline.

Pure arithmetic over an injected clock and random source, so the rules are tested without a
server (``tests/unit/test_client_backoff.py``):

* a node that sends ``Retry-After`` knows best: the wait is at least that long. On top comes a
  random share of the exponential step, so fifty clients refused at once do not all come back
  in the same millisecond (the node's 429 carries the same ``Retry-After`` for everyone);
* without the header the wait is "equal jitter": half the step plus a random other half, the
  step doubling from ``base_s`` up to ``cap_s``;
* every logical call has one deadline, waits included. A wait that would end past it is not
  taken: the caller gives up at once with the last answer (``CapacityError`` after 429s),
  rather than sleeping only to fail;
* ``Retry-After`` is delta-seconds or an HTTP-date (RFC 9110 §10.2.3); anything else is
  ignored, and a value beyond ``MAX_RETRY_AFTER_S`` is capped there.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: A node asking for more than this is treated as asking for this: a client that slept an hour
#: on one header would look hung. The deadline bounds the wait anyway.
MAX_RETRY_AFTER_S = 300.0


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header; None if absent or malformed."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        return min(float(int(text)), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT; a bare one means the same
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


@dataclass(frozen=True)
class Backoff:
    """How long to wait before attempt ``n + 1`` (``n`` counts from 0)."""

    #: The first step: a node's admission queue drains a start in ~0.3-2 s.
    base_s: float = 0.25
    #: The longest step: longer makes a client slow to notice room again.
    cap_s: float = 10.0
    random: Callable[[], float] = field(default=random.random, compare=False)
    """Uniform in [0, 1); injected in tests."""

    def step(self, attempt: int) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 32))

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        step = self.step(attempt)
        if retry_after_s is not None:
            # At least what the node asked; the jitter spreads the herd over one more step.
            spread = min(step, max(retry_after_s, self.base_s))
            return float(retry_after_s + self.random() * spread)
        return float(step / 2 + self.random() * step / 2)


@dataclass
class Deadline:
    """One logical call's time budget on a monotonic clock (None: no limit)."""

    seconds: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def remaining(self) -> float | None:
        if self.seconds is None:
            return None
        return self.started + self.seconds - self.clock()

    @property
    def expired(self) -> bool:
        remaining = self.remaining
        return remaining is not None and remaining <= 0

    def allows(self, wait_s: float) -> bool:
        """Whether a wait of ``wait_s`` still ends before the deadline."""
        remaining = self.remaining
        return remaining is None or wait_s < remaining

    def cap(self, timeout_s: float) -> float:
        """``timeout_s`` for one attempt, cut to what is left (never below a small floor, so
        an attempt started just before the end still gets to send its request)."""
        remaining = self.remaining
        if remaining is None:
            return timeout_s
        return max(min(timeout_s, remaining), 0.5)
