"""Commits and garbage collection on one node exclude each other.

A GC pass lists manifests, then deletes the blobs none names; a commit on this node that
found a blob present (and so did not put it) must not have that blob deleted before its
manifest names it. So commits run together, and a pass runs alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class CommitGate:
    """Commits run together; garbage collection runs alone (asyncio has no reader-writer
    lock; this is the smallest one that serves)."""

    def __init__(self) -> None:
        self._commits = 0
        self._collecting = False
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def commit(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._collecting)
            self._commits += 1
        try:
            yield
        finally:
            async with self._changed:
                self._commits -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def collect(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._collecting and not self._commits)
            self._collecting = True
        try:
            yield
        finally:
            async with self._changed:
                self._collecting = False
                self._changed.notify_all()
