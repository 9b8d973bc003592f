"""Lifecycle webhooks (docs/webhooks.md; E2B's ``/events/webhooks``, payload ``v2``): a team
registers a URL and the event types it wants; each event of its sandboxes is POSTed there,
signed, at least once.

* **Events** come from the store's own record of every lifecycle change (``Store.on_event``,
  as the logs do): ``sandbox.lifecycle.created`` (a create, a fork child), ``resumed``,
  ``paused``, ``checkpointed`` (a snapshot taken), ``updated`` (its timeout or network
  changed), ``killed``. Queued in line; the next pass writes one delivery per subscribed,
  enabled webhook of the sandbox's team into the outbox (``store/webhooks.py``).
* **Deliveries** are tried from the outbox by one loop: ``POST`` of the payload with
  ``e2b-webhook-id``, ``e2b-delivery-id`` (the same on every try of it: a receiver drops a
  delivery it has seen), ``e2b-signature-version: v1`` and ``e2b-signature`` (unpadded
  base64 of SHA-256 over the signing secret then the raw body). A 2xx answer delivers it;
  anything else is tried again after 1, 2, 4 … s (at most ``retry_max_s``) until
  ``give_up_s`` after the event, then marked failed. The outbox is in the node's database,
  so a delivery outlives a restart and is retried with its id.
* **Where to**: ``http`` or ``https`` only; an address on the node's loopback, private or
  link-local ranges is refused unless ``allow_private`` (the node would otherwise be a way
  into its own network).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from aenv.core.errors import AenvError, InvalidArgument, NotFound
from aenv.core.states import SandboxState
from aenv.orchestrator.secrets import Vault
from aenv.store.models import SandboxRecord
from aenv.store.webhooks import DELIVERED, FAILED, PENDING, DeliveryRow, WebhookRow, WebhookStore

log = logging.getLogger("aenv.orchestrator.webhooks")

PREFIX = "sandbox.lifecycle."
EVENT_TYPES = tuple(PREFIX + t for t in
                    ("created", "killed", "updated", "paused", "resumed", "checkpointed"))
#: Webhooks a team may have.
MAX_WEBHOOKS = 20
#: Deliveries tried at once.
CONCURRENCY = 8
#: A receiver has this long to answer a delivery.
TIMEOUT_S = 10.0
#: How long after an event its pass begins: the events of that moment go in one batch, and
#: the outbox's writes and the delivery do not run inside the operation's answer.
BATCH_S = 0.2
#: Delivered and failed deliveries are kept this long for the delivery log.
KEEP_DONE_S = 7 * 86_400.0


def event_type(kind: str, detail: Any) -> str | None:
    """The webhook event of a store event; None: none."""
    previous = detail.get("from") if isinstance(detail, dict) else None
    if kind == "deleted":
        return PREFIX + "killed"
    if kind == "updated":
        return PREFIX + "updated"
    if kind == f"state:{SandboxState.RUNNING}":
        return {"creating": PREFIX + "created", "resuming": PREFIX + "resumed",
                "snapshotting": PREFIX + "checkpointed"}.get(str(previous))
    if kind == f"state:{SandboxState.PAUSED}" and previous == SandboxState.PAUSING:
        return PREFIX + "paused"
    return None


def signature(secret: str, body: bytes) -> str:
    """E2B's ``e2b-signature``: unpadded base64 of SHA-256 over the secret, then the body."""
    digest = hashlib.sha256(secret.encode() + body).digest()
    return base64.b64encode(digest).decode().rstrip("=")


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2048:
        raise InvalidArgument("url must be an http or https URL with a host")
    return url


def check_events(events: list[str] | None) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(events or EVENT_TYPES))
    unknown = [e for e in chosen if e not in EVENT_TYPES]
    if unknown:
        raise InvalidArgument(f"unknown event types {unknown}; known: {list(EVENT_TYPES)}")
    return chosen


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class WebhookDefs(Protocol):
    """Where the teams' webhooks are kept: the node's database, or in a cluster the cluster's
    Redis (``cluster/webhook_store.py``), so every node delivers to every webhook. May raise
    the store's own errors (``Unavailable``: it cannot be reached)."""

    async def put(self, row: WebhookRow) -> None: ...
    async def get(self, webhook_id: str) -> WebhookRow | None: ...
    async def of_team(self, team_id: str) -> list[WebhookRow]: ...
    async def delete(self, webhook_id: str) -> bool: ...


@dataclass(frozen=True)
class _Event:
    event_id: str
    type: str
    sandbox_id: str
    team_id: str | None
    at: float
    record: SandboxRecord | None


class Webhooks:
    """``defs``: the webhooks; ``outbox``: the node's deliveries (in a cluster each node
    delivers the events of its own sandboxes, so each event once); ``default_team``: the
    team of a record that names none."""

    def __init__(self, defs: WebhookDefs, outbox: WebhookStore, vault: Vault,
                 default_team: Callable[[], str], *,
                 allow_private: bool = False, retry_max_s: float = 300.0,
                 give_up_s: float = 86_400.0, clock: Callable[[], float] = time.time) -> None:
        self.defs = defs
        self.outbox = outbox
        self.vault = vault
        self.default_team = default_team
        self.allow_private = allow_private
        self.retry_max_s = retry_max_s
        self.give_up_s = give_up_s
        self.clock = clock
        self._queued: list[_Event] = []
        self._wake = asyncio.Event()
        self._http: httpx.AsyncClient | None = None

    # -- the team's webhooks -------------------------------------------------------------------

    async def create(self, team_id: str, *, name: str, url: str, enabled: bool,
                     events: list[str] | None, secret: str | None) -> WebhookRow:
        if len(await self.defs.of_team(team_id)) >= MAX_WEBHOOKS:
            raise InvalidArgument(f"a team has at most {MAX_WEBHOOKS} webhooks")
        webhook_id = str(uuid.uuid4())
        row = WebhookRow(webhook_id, team_id, _name(name), check_url(url), enabled,
                         check_events(events), self._seal(webhook_id, secret), self.clock())
        await self.defs.put(row)
        return row

    async def get(self, team_id: str, webhook_id: str) -> WebhookRow:
        row = await self.defs.get(webhook_id)
        if row is None or row.team_id != team_id:
            raise NotFound(f"webhook {webhook_id} not found")
        return row

    async def update(self, team_id: str, webhook_id: str, *, name: str | None = None,
                     url: str | None = None, enabled: bool | None = None,
                     events: list[str] | None = None, secret: str | None = None
                     ) -> WebhookRow:
        """The fields given replace the webhook's (E2B's PATCH)."""
        row = await self.get(team_id, webhook_id)
        row = replace(
            row, name=_name(name) if name is not None else row.name,
            url=check_url(url) if url is not None else row.url,
            enabled=row.enabled if enabled is None else enabled,
            events=check_events(events) if events is not None else row.events,
            sealed_secret=self._seal(webhook_id, secret) if secret is not None
            else row.sealed_secret)
        await self.defs.put(row)
        return row

    async def delete(self, team_id: str, webhook_id: str) -> None:
        await self.get(team_id, webhook_id)
        await self.defs.delete(webhook_id)
        await self.outbox.drop_pending(webhook_id)  # other nodes' go at their next try

    def _seal(self, webhook_id: str, secret: str | None) -> bytes | None:
        if secret is None:
            return None
        if not 1 <= len(secret) <= 1024:
            raise InvalidArgument("signatureSecret must be 1 to 1024 characters")
        return self.vault.seal_for(secret, f"webhook:{webhook_id}")

    # -- events --------------------------------------------------------------------------------

    def on_event(self, sandbox_id: str, team_id: str | None, kind: str, detail: Any,
                 record: SandboxRecord | None = None) -> None:
        kind_of = event_type(kind, detail)
        if kind_of is not None:
            self._queued.append(_Event(str(uuid.uuid4()), kind_of, sandbox_id, team_id,
                                       self.clock(), record))
            self._wake.set()

    async def flush(self) -> None:
        """The queued events into the outbox: one delivery per webhook that wants each."""
        events, self._queued = self._queued, []
        hooks: dict[str, list[WebhookRow]] = {}
        out: list[DeliveryRow] = []
        try:
            for event in events:
                team = event.team_id or self.default_team()
                if team not in hooks:
                    hooks[team] = await self.defs.of_team(team)
                body = json.dumps(self._payload(event, team), separators=(",", ":"))
                out += [DeliveryRow(str(uuid.uuid4()), hook.webhook_id, event.event_id,
                                    event.type, body, PENDING, 0, event.at, event.at)
                        for hook in hooks[team] if hook.enabled and event.type in hook.events]
            await self.outbox.enqueue(out)
        except BaseException:
            self._queued[:0] = events  # the webhooks or the outbox were away: next pass
            raise

    def _payload(self, event: _Event, team: str) -> dict[str, Any]:
        record = event.record
        data: dict[str, Any] = {"sandbox_metadata": dict(record.metadata or {}) if record
                                else {}}
        if record is not None and event.type in (PREFIX + "killed", PREFIX + "paused"):
            data["execution"] = {
                "started_at": _iso(record.started_at), "vcpu_count": record.cpu_count,
                "memory_mb": record.memory_mb,
                "execution_time": max(0, int((event.at - record.started_at) * 1000))}
        execution = hashlib.sha256(
            f"{event.sandbox_id}:{record.started_at if record else 0}".encode()).hexdigest()
        return {"version": "v2", "id": event.event_id, "type": event.type, "eventData": data,
                "sandboxBuildId": "", "sandboxExecutionId": execution[:32],
                "sandboxId": event.sandbox_id, "sandboxTeamId": team,
                "sandboxTemplateId": record.template_id if record else "",
                "timestamp": _iso(event.at)}

    # -- delivery ------------------------------------------------------------------------------

    async def run(self) -> None:
        """The loop: events into the outbox, due deliveries tried, old ones dropped."""
        self._http = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False)
        swept = 0.0
        try:
            while True:
                try:
                    await self.flush()
                    await self.deliver_due()
                    if self.clock() - swept > 3600:
                        swept = self.clock()
                        await self.outbox.drop_done_before(swept - KEEP_DONE_S)
                except asyncio.CancelledError:
                    raise
                except AenvError as exc:
                    # The cluster's Redis away (Unavailable): the events stay queued.
                    log.warning("webhooks: a pass failed (%s); the next one retries",
                                exc.message)
                except Exception:
                    log.exception("webhooks: a pass failed; the next one retries")
                nxt = await self.outbox.next_due()
                wait = 1.0 if nxt is None else min(1.0, max(0.05, nxt - self.clock()))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                if self._wake.is_set():
                    # The operation that made the event is still answering: let it, and let
                    # the events that follow it join this pass.
                    await asyncio.sleep(BATCH_S)
        finally:
            await self._http.aclose()

    async def deliver_due(self) -> None:
        """The due deliveries: a webhook's one after another, oldest event first (so a
        receiver that answers sees them in order), ``CONCURRENCY`` webhooks at a time."""
        gate = asyncio.Semaphore(CONCURRENCY)
        by_hook: dict[str, list[DeliveryRow]] = {}
        for d in await self.outbox.due(self.clock(), 64):
            by_hook.setdefault(d.webhook_id, []).append(d)

        async def in_order(deliveries: list[DeliveryRow]) -> None:
            async with gate:
                for d in deliveries:
                    await self._deliver(d)

        await asyncio.gather(*(in_order(ds) for ds in by_hook.values()))

    async def _deliver(self, d: DeliveryRow) -> None:
        hook = await self.defs.get(d.webhook_id)
        attempts = d.attempts + 1
        if hook is None:  # deleted (through another node: its outbox kept this one)
            await self.outbox.record(d.delivery_id, status=FAILED, attempts=d.attempts,
                                     next_at=d.next_at, last_status=None,
                                     last_error="the webhook was deleted",
                                     done_at=self.clock())
            return
        status: int | None = None
        error: str | None = None
        try:
            await self._check_destination(hook.url)
            headers = {"content-type": "application/json", "e2b-webhook-id": hook.webhook_id,
                       "e2b-delivery-id": d.delivery_id, "e2b-signature-version": "v1",
                       "user-agent": "aenv-webhooks"}
            secret = self.vault.open_for(hook.sealed_secret, f"webhook:{hook.webhook_id}") \
                if hook.sealed_secret else None
            if secret is not None:
                headers["e2b-signature"] = signature(secret, d.payload.encode())
            assert self._http is not None
            answer = await self._http.post(hook.url, content=d.payload.encode(),
                                           headers=headers)
            status = answer.status_code
            if 200 <= status < 300:
                await self.outbox.record(d.delivery_id, status=DELIVERED, attempts=attempts,
                                       next_at=d.next_at, last_status=status,
                                       last_error=None, done_at=self.clock())
                return
            error = f"answered {status}"
        except _Refused as exc:
            await self.outbox.record(d.delivery_id, status=FAILED, attempts=attempts,
                                   next_at=d.next_at, last_status=None, last_error=str(exc),
                                   done_at=self.clock())
            return
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        now = self.clock()
        if now - d.created_at >= self.give_up_s:
            await self.outbox.record(d.delivery_id, status=FAILED, attempts=attempts,
                                   next_at=d.next_at, last_status=status, last_error=error,
                                   done_at=now)
            log.warning("webhook %s: gave up delivery %s after %d tries: %s",
                        hook.webhook_id, d.delivery_id, attempts, error)
            return
        delay = min(self.retry_max_s, 2.0 ** (attempts - 1))
        await self.outbox.record(d.delivery_id, status=PENDING, attempts=attempts,
                               next_at=now + delay, last_status=status, last_error=error,
                               done_at=None)

    async def _check_destination(self, url: str) -> None:
        if self.allow_private:
            return
        host = urlsplit(url).hostname or ""
        port = urlsplit(url).port or (443 if url.startswith("https") else 80)
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from exc
        for *_, address in found:
            ip = ipaddress.ip_address(address[0])
            if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved \
                    or ip.is_multicast or ip.is_unspecified:
                raise _Refused(f"{host} is {ip}, a private address: not delivered (the "
                               "node's webhook_allow_private is off)")


class _Refused(Exception):
    """The destination may not be reached from the node: the delivery fails at once."""


def _name(name: str) -> str:
    name = name.strip()
    if not 1 <= len(name) <= 256 or not name.isprintable():
        raise InvalidArgument("name must be 1 to 256 printable characters")
    return name
