"""One asyncio lock per key (a sandbox id, say), kept only while someone holds or awaits it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class KeyedLocks:
    """``async with locks.hold(key):`` runs one holder per key at a time, in arrival order.

    Not re-entrant: a holder that asks for its own key again waits for itself forever.
    """

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._locks[key]

    def held(self, key: str) -> bool:
        return key in self._locks and self._locks[key].locked()
