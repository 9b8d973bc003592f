"""A pool of started, not yet claimed sandboxes of the default template.

Starting one means restoring the template's memory image (or, without one, booting the
runtime and envd): hundreds of milliseconds to seconds, where claiming a ready one takes
milliseconds. The pool keeps up to ``size`` ready (high watermark) and refills in the
background once fewer than ``low`` are left. Each is *primed*: its envd is given, ahead, what
a create of the template with no more than that gives it (a token of its own, the template's
env vars, user and workdir, a fresh boot id), so such a create, the usual one, skips its
``/init`` round trip into the guest (~25 of ~40 ms; ``ops/create.py``). The token stays on
this node until the create that claims the sandbox puts it in its record. Priming also runs
the SDK's first command (``bash -l -c true``) once: a restored sandbox maps its memory back in
as the guest touches it, which the user's first command paid (~8-15 ms; it has ended, and
shows nowhere, by the claim).

Warm sandboxes have no store record: a crash leaves them as orphans, which recovery destroys.
Each one costs an idle sandbox's memory (see docs/benchmarks.md); ``AENV_WARM_POOL_SIZE=0``
turns the pool off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace

from aenv.core.errors import FailedPrecondition
from aenv.core.ids import new_access_token, new_sandbox_id
from aenv.core.unwind import to_the_end
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.ops.boot import Booted, boot_sandbox, discard, hand_identity
from aenv.orchestrator.template_image import warm_up
from aenv.runtime.base import ENVD_PORT

log = logging.getLogger("aenv.orchestrator.warm")

#: After a failed boot, wait before retrying (doubling), so a broken host is not hammered.
RETRY_S = 1.0
RETRY_MAX_S = 60.0
#: A refill waits this long after the last take while some are still ready: a restore's
#: first ~100 ms are its heaviest, and on a small host they slowed the first command of the
#: sandbox just taken by ~20 ms (measured: create 9 ms, first command 68 vs 47 ms).
QUIET_AFTER_TAKE_S = 0.3


class WarmPool:
    """Empty until :meth:`start` names the template it keeps."""

    def __init__(self, size: int, low: int | None = None) -> None:
        self._node: Node | None = None
        self.template: Template | None = None
        self.size = size
        #: Refill starts below this many ready sandboxes (and goes up to ``size``).
        self.low = size if low is None else min(low, size)
        self._ready: deque[Booted] = deque()
        self._wake = asyncio.Event()
        self._taken_at = 0.0
        #: Sandboxes being booted for the pool now (each holds a network slot).
        self.making = 0

    @property
    def node(self) -> Node:
        if self._node is None:
            raise FailedPrecondition("the warm pool has not started")
        return self._node

    async def start(self, node: Node, template: Template) -> None:
        self._node, self.template = node, template
        if self.size > 0:
            node.supervisor.spawn("warm-pool", self._fill)

    def take(self, template: Template) -> Booted | None:
        """A ready sandbox of exactly ``template`` (same layers and memory image), or ``None``
        (then the caller starts one itself)."""
        if self.template is None or template != self.template or not self._ready:
            return None
        booted = self._ready.popleft()
        self._taken_at = time.monotonic()
        if len(self._ready) < self.low:
            self._wake.set()
        return booted

    @property
    def ready(self) -> int:
        return len(self._ready)

    async def close(self) -> None:
        """After the supervisor stopped the refill: the ready sandboxes are destroyed."""
        # At once: each destroy waits ~1-2 s for the host to reap the sandbox's processes.
        ready, self._ready = list(self._ready), deque()
        if ready:
            await asyncio.gather(*(discard(self.node, booted) for booted in ready))

    async def _fill(self) -> None:
        delay = RETRY_S
        while True:
            while len(self._ready) < self.size:
                # Out of the way of the sandbox just taken, unless none is left to take.
                quiet_in = self._taken_at + QUIET_AFTER_TAKE_S - time.monotonic()
                if self._ready and quiet_in > 0:
                    await asyncio.sleep(quiet_in)
                    continue  # taken from meanwhile: quiet again from then
                try:
                    booted = await self._boot()
                except Exception as exc:
                    log.warning("warm boot failed (retrying in %.0fs): %s", delay, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                delay = RETRY_S
                self._ready.append(booted)
                log.info("warm sandbox %s ready in %.0f ms", booted.sandbox_id,
                         sum(booted.phases.values()))
            self._wake.clear()
            await self._wake.wait()

    async def _boot(self) -> Booted:
        assert self.template is not None  # set by start, before the refill
        self.making += 1
        try:
            booted = await boot_sandbox(self.node, new_sandbox_id(), self.template)
            return await self._prime(booted)
        finally:
            self.making -= 1

    async def _prime(self, booted: Booted) -> Booted:
        """``booted`` with its envd initialised as a plain create of the template would; on
        failure it is destroyed and the error propagates."""
        token = new_access_token()
        try:
            await hand_identity(self.node, booted, token=token,
                                env_vars=dict(booted.template.env_vars), renew_boot_id=True)
            # A restored sandbox maps its memory back in as the guest touches it: the first
            # command paid ~9 ms more than the next for bash's and envd's pages. Paid here.
            await warm_up(self.node, booted, token, runs=1)
            # And one idle connection in the proxy's pool: the first request through the
            # proxy then skips the TCP handshake into the guest's network stack.
            conn = await self.node.guests.acquire(booted.slot, ENVD_PORT)
            self.node.guests.release(conn, reusable=True)
        except BaseException:
            await to_the_end(discard(self.node, booted))
            raise
        return replace(booted, primed_token=token)
