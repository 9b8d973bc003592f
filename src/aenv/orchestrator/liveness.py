"""Envd liveness: a running sandbox whose envd stops answering is noticed within seconds.

A sandbox can be ``running`` to the runtime while its envd is stuck: root inside it can
``PTRACE_ATTACH`` envd (PID 1), which stops it; the guest's network stack (the sentry's) still
accepts connections, so proxied SDK requests connect and then hang until their client gives up
(~178 s measured). Nothing else on the node looks at envd after its ``/init``.

One supervised task of the server probes envd's ``GET /health`` in every ``running`` sandbox
(not paused ones, frozen or not; not one in a transitional state) each ``INTERVAL_S``, at most
``CONCURRENCY`` at once, over the proxy's pooled keep-alive connections (a few hundred bytes a
probe, no client objects: cheap for hundreds of sandboxes). A probe that fails or gets no
answer within ``PROBE_TIMEOUT_S`` is repeated at once (a kept-alive connection the guest
closed is not a stuck envd); if that fails too and the record is still
the same running sandbox (a snapshot or pause closes the connections under a probe), the
verdict goes into ``Liveness``. Detection takes at most ``INTERVAL_S + 2 * PROBE_TIMEOUT_S``.
The first answer clears it.

The verdict is shown in the sandbox's info (``envdUnresponsive``, with a reason), logged once
per change, and makes the proxy answer requests to envd's port at once with a 502 instead of
letting them hang (``proxy/unresponsive.py``). Other ports are relayed as before: the rest of
the guest may well be serving. The sandbox is not killed: a debugger on envd is the user's to
detach, and the sandbox's lifetime still ends it.

Owns: the verdicts (in memory: a restart probes afresh). Must not touch: the sandbox (no
kill, no state change), connections other than its own probes'.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aenv.core.net import NetSlot
from aenv.core.states import SandboxState
from aenv.orchestrator.instance_codec import decode
from aenv.runtime.base import ENVD_PORT
from aenv.store.models import SandboxRecord

if TYPE_CHECKING:  # context.py holds a Liveness
    from aenv.orchestrator.context import Node

log = logging.getLogger("aenv.orchestrator.liveness")

#: Between probe rounds. With ``PROBE_TIMEOUT_S`` it bounds how long a stuck envd goes
#: unnoticed (the issue's bar: seconds).
INTERVAL_S = 1.0
#: envd answers ``/health`` in milliseconds; 2 s of silence twice in a row (as long as a pause
#: waits before calling the guest unresponsive, ``envd_client.HEALTH_PROBE_S``) is a stuck or
#: starved envd, not a busy host: a false verdict would refuse that sandbox's envd requests
#: until the next answered probe, a second later.
PROBE_TIMEOUT_S = 2.0
#: Probes in flight at once: a round over hundreds of sandboxes stays a few hundred
#: milliseconds of the node's CPU, and a stuck sandbox holds one of them for its timeouts.
CONCURRENCY = 64
_HEALTH = b"GET /health HTTP/1.1\r\nhost: envd\r\nuser-agent: aenv-liveness\r\n\r\n"


@dataclass(frozen=True)
class Verdict:
    """Why a sandbox's envd is called unresponsive, and since when (wall clock)."""

    reason: str
    since: float


class Liveness:
    """Sandboxes whose envd does not answer; read by the API and the proxy on their paths,
    so a look-up is one dict read."""

    def __init__(self) -> None:
        self._stuck: dict[str, Verdict] = {}

    def verdict(self, sandbox_id: str) -> Verdict | None:
        return self._stuck.get(sandbox_id)

    def mark(self, sandbox_id: str, reason: str, now: float) -> bool:
        """Record the verdict; True if it is new (the caller logs it)."""
        if sandbox_id in self._stuck:
            return False
        self._stuck[sandbox_id] = Verdict(reason, now)
        return True

    def clear(self, sandbox_id: str) -> Verdict | None:
        """Drop the verdict; the one dropped, if any."""
        return self._stuck.pop(sandbox_id, None)

    def retain(self, sandbox_ids: Collection[str]) -> None:
        """Forget sandboxes not in ``sandbox_ids`` (gone or no longer running: a resumed one
        is probed afresh)."""
        for sandbox_id in [s for s in self._stuck if s not in sandbox_ids]:
            del self._stuck[sandbox_id]


async def _probe(node: Node, slot: NetSlot) -> str | None:
    """One ``GET /health`` over a pooled connection: None if envd answered 204, else why
    not."""
    conn = None
    reusable = False
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            conn = await node.guests.acquire(slot, ENVD_PORT)
            conn.writer.write(_HEALTH)
            head = await conn.reader.readuntil(b"\r\n\r\n")
            # /health has no body (204); anything else, and the connection is not reused.
            status = head.split(b" ", 2)[1] if head.count(b" ") >= 1 else b"?"
            reusable = status == b"204"
            if reusable:
                return None
            return f"envd answered /health with {status.decode('latin-1')[:3]}"
    except TimeoutError:
        if conn is None:
            return f"envd accepted no connection within {PROBE_TIMEOUT_S:g} s"
        return f"envd did not answer /health within {PROBE_TIMEOUT_S:g} s"
    except Exception as exc:  # refused, reset, the veth gone: reported, judged by the caller
        return f"envd's /health failed: {exc!r}"[:300]
    finally:
        if conn is not None:
            node.guests.release(conn, reusable=reusable)


async def _still_running(node: Node, record: SandboxRecord) -> bool:
    """The same sandbox, still ``running`` on the same runtime (a pause, snapshot or kill
    closes its connections under a probe: that failure says nothing about envd)."""
    now = await node.store.get(record.sandbox_id)
    return (now is not None and now.state == SandboxState.RUNNING
            and now.instance == record.instance)


async def check(node: Node, record: SandboxRecord) -> None:
    """Probe one running sandbox's envd and update its verdict."""
    slot, _ = decode(record.instance, record.sandbox_id)
    if slot is None:
        return
    sid = record.sandbox_id
    why = await _probe(node, slot)
    if why is not None and node.liveness.verdict(sid) is None:
        why = await _probe(node, slot)  # once more, on a fresh connection
    if why is None:
        if (gone := node.liveness.clear(sid)) is not None:
            log.info("envd of sandbox %s answers again (unresponsive for %.0f s)", sid,
                     node.clock() - gone.since)
        return
    if await _still_running(node, record) and node.liveness.mark(sid, why, node.clock()):
        log.warning("envd of sandbox %s is unresponsive: %s", sid, why)


async def check_all(node: Node) -> None:
    """One round over every running sandbox."""
    running = await node.store.list([SandboxState.RUNNING])
    node.liveness.retain({r.sandbox_id for r in running})
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(record: SandboxRecord) -> None:
        async with gate:
            await check(node, record)

    results = await asyncio.gather(*(one(r) for r in running), return_exceptions=True)
    for record, result in zip(running, results, strict=True):
        if isinstance(result, Exception):
            log.error("liveness probe of %s failed", record.sandbox_id, exc_info=result)


async def run_liveness_loop(node: Node) -> None:
    """The supervised loop (``server.py``): a round, then ``INTERVAL_S``, forever."""
    while True:
        started = time.monotonic()
        try:
            await check_all(node)
        except Exception:
            log.exception("a liveness round failed")
        await asyncio.sleep(max(0.1, INTERVAL_S - (time.monotonic() - started)))
