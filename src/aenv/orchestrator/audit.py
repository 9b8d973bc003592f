"""The audit trail: who (which key) did what (method and route) to which object, when, from
where, with what outcome, for every request that changes something (docs/audit.md).

The API hands each entry over without waiting (:meth:`AuditTrail.record`): a request never
pays for the write. A supervised loop writes what is pending every ``FLUSH_S`` in one
transaction and keeps the newest ``audit_max_entries``; a read writes what is pending first,
so an entry is readable as soon as its request has been answered; the node's shutdown writes
the rest. An entry that cannot be written is logged and dropped, never retried forever: the
log is an account of the node, not part of its state.

Where entries are written is :class:`AuditRows`: the node's database (``store/audit.py``),
or in cluster mode the cluster's Redis stream (``cluster/audit_store.py``), into which every
node writes, so that ``GET /audit`` on any node reads the whole cluster's log.

Owns: the pending entries; nothing else writes the audit log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from aenv.core.errors import Unavailable
from aenv.store.models import AuditEntry

log = logging.getLogger("aenv.orchestrator.audit")

FLUSH_S = 0.5
#: Pending entries beyond this are dropped (counted and logged): a stalled disk must not grow
#: the node's memory without bound.
MAX_PENDING = 10_000


class AuditRows(Protocol):
    """The log's store. ``append`` writes entries in order, each given the next ``seq``
    (growing, never reused); ``query`` reads newest first (highest ``seq`` first), at most
    ``limit`` entries older than ``before`` and matching every filter given; ``keep_newest``
    drops all but about the newest ``count`` and says how many went. Every method may raise
    the store's own errors (``Unavailable``: it cannot be reached)."""

    async def append(self, entries: Sequence[AuditEntry]) -> None: ...
    async def query(self, *, limit: int, before: int | None = None,
                    object_id: str | None = None, actor: str | None = None,
                    team_id: str | None = None) -> list[AuditEntry]: ...
    async def keep_newest(self, count: int) -> int: ...


class AuditTrail:
    def __init__(self, store: AuditRows, keep: int) -> None:
        self.store = store
        self.keep = keep
        self._pending: list[AuditEntry] = []
        self._dropped = 0
        self._lock = asyncio.Lock()

    def record(self, entry: AuditEntry) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._dropped += 1
            return
        self._pending.append(entry)

    async def flush(self) -> None:
        async with self._lock:
            batch, self._pending = self._pending, []
            if self._dropped:
                log.warning("audit: %d entries dropped (the log could not keep up)",
                            self._dropped)
                self._dropped = 0
            try:
                await self.store.append(batch)
                if batch:
                    await self.store.keep_newest(self.keep)
            except Unavailable as exc:
                # The cluster's store is down (Redis): one line each time, not a traceback
                # every half second of an outage.
                log.warning("audit: %d entries could not be written: %s", len(batch),
                            exc.message)
            except Exception:
                log.exception("audit: %d entries could not be written", len(batch))

    async def run_flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush()

    async def query(self, *, limit: int, before: int | None = None,
                    object_id: str | None = None, actor: str | None = None,
                    team_id: str | None = None) -> list[AuditEntry]:
        await self.flush()
        return await self.store.query(limit=limit, before=before, object_id=object_id,
                                      actor=actor, team_id=team_id)
