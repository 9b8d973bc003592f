"""The node's shutdown steps (``compose/root.py``): one that hangs is cut short and said, and
the steps after it still run, so a stuck step cannot leave the pools' sandboxes running."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from aenv.compose import root

pytestmark = pytest.mark.anyio


async def test_a_hanging_step_is_cut_short_and_the_rest_still_close(
        caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise RuntimeError("broken")

    async def quick(name: str) -> None:
        closed.append(name)

    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="aenv.compose"):
        async with contextlib.AsyncExitStack() as stack:
            root._closing(stack, "the warm pool", lambda: quick("warm"))
            root._closing(stack, "a failing step", fails)
            root._closing(stack, "the audit trail", hangs, within_s=0.2)
            root._closing(stack, "the kills in flight", lambda: quick("kills"))
    assert closed == ["kills", "warm"]  # in reverse, the hung and the failed one between
    assert time.monotonic() - started < 2
    assert "closing the audit trail did not end within 0.2 s: cut short" in caplog.text
    assert "closing a failing step failed" in caplog.text
