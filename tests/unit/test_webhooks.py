"""Webhooks' own rules (``orchestrator/webhooks.py``) on a real SQLite store: which store
events become which webhook events, E2B's signature, a destination on a private address
refused at once (the node is no way into its own network), the backoff between tries and the
give-up, and what a webhook accepts."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import httpx
import pytest

from aenv.core.errors import InvalidArgument
from aenv.orchestrator.secrets import Vault
from aenv.orchestrator.webhooks import Webhooks, check_events, check_url, event_type, signature
from aenv.store.secrets import SecretStore
from aenv.store.sqlite import Store
from aenv.store.webhooks import FAILED, PENDING, WebhookStore

pytestmark = pytest.mark.anyio
KEY = "e2b_" + "7" * 40


async def _hooks(tmp_path: Path, now: list[float], **options: object) -> tuple[Store, Webhooks]:
    store = await Store.open(tmp_path / "state.db")
    vault = Vault(SecretStore(store.db), KEY)
    rows = WebhookStore(store.db)
    hooks = Webhooks(rows, rows, vault, lambda: "team-d", clock=lambda: now[0],
                     **options)  # type: ignore[arg-type]
    return store, hooks


def test_which_events_are_sent_and_how_they_are_signed() -> None:
    assert event_type("state:running", {"from": "creating"}) == "sandbox.lifecycle.created"
    assert event_type("state:running", {"from": "resuming"}) == "sandbox.lifecycle.resumed"
    assert event_type("state:running", {"from": "snapshotting"}) \
        == "sandbox.lifecycle.checkpointed"
    assert event_type("state:paused", {"from": "pausing"}) == "sandbox.lifecycle.paused"
    assert event_type("state:paused", {"from": "resuming"}) is None  # a failed resume
    assert event_type("state:pausing", {"from": "running"}) is None
    assert event_type("deleted", None) == "sandbox.lifecycle.killed"
    assert event_type("updated", {"what": "timeout"}) == "sandbox.lifecycle.updated"
    body = b'{"a":1}'
    digest = base64.b64encode(hashlib.sha256(b"s3cret" + body).digest()).decode()
    assert signature("s3cret", body) == digest.rstrip("=") and "=" not in signature("s", b"")
    assert check_url("https://hooks.example/x") and check_events(None)
    for bad in ("ftp://x/", "http:///nohost", "x" * 10):
        with pytest.raises(InvalidArgument):
            check_url(bad)
    with pytest.raises(InvalidArgument):
        check_events(["sandbox.lifecycle.exploded"])


async def test_a_private_destination_fails_at_once_and_failures_back_off(
        tmp_path: Path) -> None:
    now = [1_000.0]
    store, hooks = await _hooks(tmp_path, now, retry_max_s=8, give_up_s=100)
    private = await hooks.create("t", name="p", url="http://127.0.0.1:9/x", enabled=True,
                                 events=None, secret="s")
    await hooks.create("t", name="q", url="http://192.0.2.1:9/x", enabled=True,
                       events=["sandbox.lifecycle.killed"], secret=None)
    hooks.on_event("s1", "t", "state:running", {"from": "creating"})
    await hooks.flush()
    async with httpx.AsyncClient(timeout=0.5) as http:
        hooks._http = http
        await hooks.deliver_due()
    [refused] = await hooks.outbox.deliveries(private.webhook_id, 10)
    assert refused.status == FAILED and "private address" in (refused.last_error or "")
    # The other webhook wanted only kills: nothing queued for it. Then a reachable-looking
    # one that never answers: tried again after 1, 2, 4, 8, 8 … s, given up after 100 s.
    hooks.allow_private = True
    later = await hooks.create("t", name="r", url="http://127.0.0.1:9/x", enabled=True,
                               events=None, secret=None)
    hooks.on_event("s1", "t", "deleted", None)
    await hooks.flush()
    gaps = []
    async with httpx.AsyncClient(timeout=0.5) as http:
        hooks._http = http
        for _ in range(40):
            await hooks.deliver_due()
            [d] = await hooks.outbox.deliveries(later.webhook_id, 10)
            if d.status != PENDING:
                break
            gaps.append(round(d.next_at - now[0]))
            now[0] = d.next_at + 0.01
    assert gaps[:5] == [1, 2, 4, 8, 8]
    assert sum(gaps) >= 100 - 8
    [d] = await hooks.outbox.deliveries(later.webhook_id, 10)
    assert d.status == FAILED and d.attempts >= 5
    await store.close()


def test_a_spill_after_a_pause_is_not_a_second_pause() -> None:
    from aenv.orchestrator.spill_events import SpillEvents
    from aenv.orchestrator.webhooks import event_type

    spills = SpillEvents()
    steps = [("state:pausing", "running"), ("state:paused", "pausing"),  # the pause
             ("state:pausing", "paused"), ("state:paused", "pausing"),  # its spill
             ("state:resuming", "paused"), ("state:running", "resuming"),
             ("state:pausing", "running"), ("state:paused", "pausing")]  # a second pause
    told = [event_type(spills.kind("s1", kind, {"from": previous}), {"from": previous})
            for kind, previous in steps]
    assert [t for t in told if t] == ["sandbox.lifecycle.paused", "sandbox.lifecycle.resumed",
                                      "sandbox.lifecycle.paused"]


async def test_events_wait_while_the_webhooks_cannot_be_read(tmp_path: Path) -> None:
    from aenv.core.errors import Unavailable
    from aenv.store.webhooks import WebhookRow

    class Away(WebhookStore):
        away = False

        async def of_team(self, team_id: str) -> list[WebhookRow]:
            if self.away:
                raise Unavailable("the cluster's webhooks cannot be reached")
            return await super().of_team(team_id)

    store = await Store.open(tmp_path / "state.db")
    defs = Away(store.db)
    hooks = Webhooks(defs, WebhookStore(store.db), Vault(SecretStore(store.db), KEY),
                     lambda: "t")
    made = await hooks.create("t", name="w", url="http://192.0.2.1:9/x", enabled=True,
                              events=None, secret=None)
    defs.away = True
    hooks.on_event("s1", "t", "state:running", {"from": "creating"})
    with pytest.raises(Unavailable):
        await hooks.flush()
    assert await hooks.outbox.deliveries(made.webhook_id, 10) == []
    defs.away = False
    await hooks.flush()  # the event was kept for the next pass
    [d] = await hooks.outbox.deliveries(made.webhook_id, 10)
    assert d.event_type == "sandbox.lifecycle.created"
    await store.close()
