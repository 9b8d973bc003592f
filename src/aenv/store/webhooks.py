"""Lifecycle webhooks and their deliveries (``orchestrator/webhooks.py`` decides what goes
in): the webhooks of a team (a node alone; in a cluster they live in Redis,
``cluster/webhook_store.py``), and the node's outbox of deliveries — pending until
delivered or given up, each with its attempts, next try and last outcome."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import aiosqlite

from aenv.store.transactions import transaction

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass(frozen=True)
class WebhookRow:
    webhook_id: str
    team_id: str
    name: str
    url: str
    enabled: bool
    events: tuple[str, ...]
    sealed_secret: bytes | None
    created_at: float


@dataclass(frozen=True)
class DeliveryRow:
    delivery_id: str
    webhook_id: str
    event_id: str
    event_type: str
    payload: str
    status: str
    attempts: int
    next_at: float
    created_at: float
    last_status: int | None = None
    last_error: str | None = None
    done_at: float | None = None


_HOOK = "webhook_id, team_id, name, url, enabled, events, sealed_secret, created_at"
_DELIVERY = ("delivery_id, webhook_id, event_id, event_type, payload, status, attempts, "
             "next_at, created_at, last_status, last_error, done_at")


def _hook(r: aiosqlite.Row) -> WebhookRow:
    return WebhookRow(r[0], r[1], r[2], r[3], bool(r[4]), tuple(json.loads(r[5])), r[6], r[7])


def _delivery(r: aiosqlite.Row) -> DeliveryRow:
    return DeliveryRow(*r)


class WebhookStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def put(self, row: WebhookRow) -> None:
        """Insert or replace the webhook."""
        await self._db.execute(
            f"INSERT OR REPLACE INTO webhooks ({_HOOK}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (row.webhook_id, row.team_id, row.name, row.url, int(row.enabled),
             json.dumps(list(row.events)), row.sealed_secret, row.created_at))

    async def get(self, webhook_id: str) -> WebhookRow | None:
        async with self._db.execute(f"SELECT {_HOOK} FROM webhooks WHERE webhook_id = ?",
                                    (webhook_id,)) as cur:
            row = await cur.fetchone()
        return _hook(row) if row is not None else None

    async def of_team(self, team_id: str) -> list[WebhookRow]:
        async with self._db.execute(
            f"SELECT {_HOOK} FROM webhooks WHERE team_id = ? ORDER BY created_at, webhook_id",
            (team_id,)) as cur:
            return [_hook(r) for r in await cur.fetchall()]

    async def delete(self, webhook_id: str) -> bool:
        cur = await self._db.execute("DELETE FROM webhooks WHERE webhook_id = ?", (webhook_id,))
        return cur.rowcount == 1

    async def drop_pending(self, webhook_id: str) -> int:
        """Forget the webhook's deliveries not yet made (it was deleted)."""
        cur = await self._db.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ? AND "
                                     "status = ?", (webhook_id, PENDING))
        return cur.rowcount

    async def enqueue(self, deliveries: Sequence[DeliveryRow]) -> None:
        """Write ``deliveries`` in one transaction."""
        if not deliveries:
            return
        async with transaction(self._db):
            await self._db.executemany(
                f"INSERT INTO webhook_deliveries ({_DELIVERY}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(d.delivery_id, d.webhook_id, d.event_id, d.event_type, d.payload, d.status,
                  d.attempts, d.next_at, d.created_at, d.last_status, d.last_error, d.done_at)
                 for d in deliveries])

    async def due(self, now: float, limit: int) -> list[DeliveryRow]:
        """Pending deliveries whose next try is due, oldest event first."""
        async with self._db.execute(
            f"SELECT {_DELIVERY} FROM webhook_deliveries WHERE status = ? AND next_at <= ? "
            "ORDER BY created_at, rowid LIMIT ?", (PENDING, now, limit)) as cur:
            return [_delivery(r) for r in await cur.fetchall()]

    async def next_due(self) -> float | None:
        async with self._db.execute(
            "SELECT MIN(next_at) FROM webhook_deliveries WHERE status = ?", (PENDING,)) as cur:
            row = await cur.fetchone()
        return float(row[0]) if row is not None and row[0] is not None else None

    async def record(self, delivery_id: str, *, status: str, attempts: int, next_at: float,
                     last_status: int | None, last_error: str | None,
                     done_at: float | None) -> None:
        await self._db.execute(
            "UPDATE webhook_deliveries SET status = ?, attempts = ?, next_at = ?, "
            "last_status = ?, last_error = ?, done_at = ? WHERE delivery_id = ?",
            (status, attempts, next_at, last_status, last_error, done_at, delivery_id))

    async def deliveries(self, webhook_id: str, limit: int) -> list[DeliveryRow]:
        """The webhook's deliveries, newest first."""
        async with self._db.execute(
            f"SELECT {_DELIVERY} FROM webhook_deliveries WHERE webhook_id = ? "
            "ORDER BY created_at DESC, delivery_id LIMIT ?", (webhook_id, limit)) as cur:
            return [_delivery(r) for r in await cur.fetchall()]

    async def drop_done_before(self, at: float) -> int:
        cur = await self._db.execute(
            "DELETE FROM webhook_deliveries WHERE status != ? AND done_at < ?", (PENDING, at))
        return cur.rowcount
