"""``Idempotency-Key`` on ``POST /sandboxes`` and ``/v2/sandboxes``: a retried create is one
sandbox, not two.

A client whose create timed out cannot know whether the node made the sandbox. If it retries
with the same ``Idempotency-Key`` (the E2B SDK's ``idempotency_key``, ``aenv.client`` always),
the node answers with the first create's sandbox (the same body, 201) instead of starting
another:

* the key is scoped by the API key that sent it (a digest of it), so two tenants cannot see
  each other's creates, and bound to the request body (a digest): the same key with another
  body is a 409, never a silent replay of something else;
* while the first create is still starting, a repeat waits for it and gets its answer. The
  create runs in a task of its own, not the first request's, so a client that gave up and
  disconnected does not take the create down with it; its retry picks the result up;
* a create that failed (a 429 from admission, a bad template) is not remembered: a retry
  tries again. Repeats that were waiting on it get the same error;
* a key is remembered for ``idempotency_ttl_s`` (1 h by default) from its first use, at most
  ``MAX_KEYS`` at once (the oldest finished ones make room). The replay is of the answer: a
  sandbox killed since is still named, as HTTP idempotency has it.

Why in memory and not in the store: the keys protect the seconds around one create, and a
node that crashes loses exactly the creates whose keys it would have lost. Recovery tears
down every sandbox still ``creating`` at the crash, so a retry after a restart rightly makes
a new one. The one case SQLite would cover is a create that finished, whose 201 was lost,
followed by a node crash before the retry: the retry makes a second sandbox, labelled like
the first by its ``run`` metadata and ended by its timeout or the run's cleanup. Not worth a
write on every create's critical path.

Keys are 1-255 printable ASCII characters (the E2B SDK allows lowercase letters, digits and
hyphens, a subset); anything else is a 400. Requests without the header are unaffected.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastapi import Request
from pydantic import BaseModel

from aenv.api.node import node_of
from aenv.api.schemas import SandboxOut
from aenv.core.errors import Conflict, InvalidArgument

HEADER = "idempotency-key"
#: Keys remembered at once: far more than creates a node starts in an hour at its limits.
MAX_KEYS = 10_000
_KEY = re.compile(r"[\x21-\x7e]{1,255}")

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    fingerprint: str
    task: asyncio.Task[T]
    expires_at: float

    def failed(self) -> bool:
        return self.task.done() and (self.task.cancelled() or self.task.exception() is not None)


class IdempotencyKeys(Generic[T]):
    """Key → the one task that answers it, for ``ttl_s`` seconds (monotonic clock)."""

    def __init__(self, ttl_s: float, *, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._clock = clock
        self._entries: dict[tuple[str, str], _Entry[T]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def run(self, scope: str, key: str, fingerprint: str,
                  create: Callable[[], Awaitable[T]]) -> T:
        """``create()``'s result, run once per live ``(scope, key)``; see the module doc."""
        now = self._clock()
        self._expire(now)
        slot = (scope, key)
        entry = self._entries.get(slot)
        if entry is not None and entry.failed():
            del self._entries[slot]
            entry = None
        if entry is None:
            self._make_room()
            task = asyncio.ensure_future(create())
            entry = _Entry(fingerprint, task, now + self.ttl_s)
            self._entries[slot] = entry
            task.add_done_callback(lambda done: self._forget_failure(slot, done))
        elif entry.fingerprint != fingerprint:
            raise Conflict("Idempotency-Key was already used for a different request; "
                           "use a new key for a new create")
        # Shielded: a repeat (or the first request) going away leaves the create running.
        return await asyncio.shield(entry.task)

    def _forget_failure(self, slot: tuple[str, str], task: asyncio.Task[T]) -> None:
        entry = self._entries.get(slot)
        if entry is not None and entry.task is task and entry.failed():
            del self._entries[slot]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters got it; no "never retrieved" warning

    def _expire(self, now: float) -> None:
        stale = [slot for slot, e in self._entries.items()
                 if e.expires_at <= now and e.task.done()]
        for slot in stale:
            del self._entries[slot]

    def _make_room(self) -> None:
        if len(self._entries) < self.max_keys:
            return
        finished = [slot for slot, e in self._entries.items() if e.task.done()]
        # Oldest first (insertion order); a pending one only if nothing else is left.
        victims = finished or list(self._entries)
        for slot in victims[: len(self._entries) - self.max_keys + 1]:
            del self._entries[slot]


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _keys_of(request: Request) -> IdempotencyKeys[SandboxOut]:
    state = request.app.state
    keys: IdempotencyKeys[SandboxOut] | None = getattr(state, "idempotency_keys", None)
    if keys is None:  # made on first use: no await between the look and the store
        keys = IdempotencyKeys(node_of(request).settings.idempotency_ttl_s)
        state.idempotency_keys = keys
    return keys


async def once(request: Request, body: BaseModel,
               create: Callable[[], Awaitable[SandboxOut]]) -> SandboxOut:
    """``create()``, or the answer of the create that already used this request's key."""
    key = request.headers.get(HEADER)
    if key is None:
        return await create()
    if not _KEY.fullmatch(key):
        raise InvalidArgument("Idempotency-Key must be 1-255 printable ASCII characters")
    scope = _digest(request.headers.get("x-api-key", ""))
    fingerprint = _digest(body.model_dump_json(by_alias=True))
    return await _keys_of(request).run(scope, key, fingerprint, create)
