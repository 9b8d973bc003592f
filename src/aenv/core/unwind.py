"""Clean-up that a cancellation cannot cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(step: Awaitable[T]) -> T:
    """Await ``step`` to its end even when the caller is cancelled meanwhile, then re-raise
    the cancellation.

    ``asyncio.shield`` alone lets the caller's task end while the step goes on unowned: a
    kill that waits for a preempted operation to unwind would then tear down beside that
    operation's own roll-back (one network slot released twice). Here the task that owns the
    operation ends only after its clean-up."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
