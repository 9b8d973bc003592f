"""A sandbox whose runtime dies: ``wait_exit`` notices at once and says why (real runsc).

SIGKILL of the sentry → ``killed`` (SIGKILL); files written into the in-memory root layer past
the sandbox's memory limit → ``out-of-memory``; both noticed within a second of the death.
The contract half (destroy and checkpoint end a wait; the fake) is in ``test_contract.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.runtime.conftest import SandboxFactory

pytestmark = [pytest.mark.anyio, pytest.mark.gvisor, pytest.mark.slow]

#: The target is 1 s from the death to ``wait_exit`` returning; measured ~0.01 s here.
NOTICE_S = 1.0


async def test_sigkill_of_the_sentry_is_noticed_at_once(sandboxes: SandboxFactory) -> None:
    booted = await sandboxes.boot(wait_envd=False)
    assert booted.instance.pid is not None
    waiter = asyncio.create_task(sandboxes.runtime.wait_exit(booted.instance))
    await asyncio.sleep(0.3)
    assert not waiter.done()
    killed_at = time.monotonic()
    os.kill(booted.instance.pid, signal.SIGKILL)
    exit = await asyncio.wait_for(waiter, 10)
    took = time.monotonic() - killed_at
    print(f"noticed in {took * 1000:.1f} ms: {exit}")
    assert took < NOTICE_S
    assert exit.cause == "killed"
    assert "SIGKILL" in exit.message


async def test_files_past_the_memory_limit_kill_the_sandbox_as_out_of_memory(
    sandboxes: SandboxFactory,
) -> None:
    """The root's writable layer is in the sandbox's memory: files past the limit are an OOM
    (measured: 13 files of 16 MiB, ~0.9 s, in a 256 MiB sandbox)."""
    booted = await sandboxes.boot(memory_mb=256)
    waiter = asyncio.create_task(sandboxes.runtime.wait_exit(booted.instance))
    writer = asyncio.create_task(
        sandboxes.sh(
            booted,
            "i=0; while dd if=/dev/urandom of=/tmp/f$i bs=1M count=16 2>/dev/null; "
            "do i=$((i+1)); echo $i; done",
            check=False,
            timeout=120,
        )
    )
    exit = await asyncio.wait_for(waiter, 120)
    print(exit)
    assert exit.cause == "out-of-memory"
    assert "of 256 MiB" in exit.message
    # The exec that was writing ends with the sandbox (runsc exec's connection breaks).
    await asyncio.wait_for(writer, 10)
