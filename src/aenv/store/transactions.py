"""One explicit transaction at a time on a connection (``transaction``).

Every store of the node shares one SQLite connection. Its single statements autocommit; a
batch (an audit flush, a page of log rows, a migration) opens ``BEGIN IMMEDIATE`` … ``COMMIT``.
Two such batches from two tasks interleave on the connection and the second ``BEGIN`` fails
("cannot start a transaction within a transaction"), so they take turns here.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator

import aiosqlite

_turns: weakref.WeakKeyDictionary[aiosqlite.Connection, asyncio.Lock] = \
    weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def transaction(db: aiosqlite.Connection) -> AsyncIterator[None]:
    """Inside: one ``BEGIN IMMEDIATE`` transaction on ``db``, committed at the end, rolled back
    if the block raises."""
    turn = _turns.get(db)
    if turn is None:
        turn = _turns[db] = asyncio.Lock()
    async with turn:
        await db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        await db.execute("COMMIT")
