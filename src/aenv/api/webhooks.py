"""E2B's lifecycle webhooks (``orchestrator/webhooks.py``; docs/webhooks.md): a team's own,
managed with its key. The signing secret is never returned. ``GET
/events/webhooks/{id}/deliveries`` (aenv's own) is the delivery log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from aenv.api.auth import CallerDep
from aenv.api.convert import iso
from aenv.api.node import NodeDep
from aenv.store.webhooks import DeliveryRow, WebhookRow

router = APIRouter()


class NewWebhook(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    url: str
    enabled: bool = True
    events: list[str] | None = Field(default=None, max_length=16)
    signatureSecret: str | None = None


class WebhookUpdate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    url: str | None = None
    enabled: bool | None = None
    events: list[str] | None = Field(default=None, max_length=16)
    signatureSecret: str | None = None


class WebhookOut(BaseModel):
    id: str
    teamID: str
    name: str
    createdAt: str
    enabled: bool
    url: str
    events: list[str]


class DeliveryOut(BaseModel):
    deliveryID: str
    eventID: str
    type: str
    status: str
    attempts: int
    lastStatus: int | None
    lastError: str | None
    createdAt: str
    nextAttemptAt: str | None
    doneAt: str | None


def _out(row: WebhookRow) -> WebhookOut:
    return WebhookOut(id=row.webhook_id, teamID=row.team_id, name=row.name,
                      createdAt=iso(row.created_at, "milliseconds"), enabled=row.enabled,
                      url=row.url,
                      events=list(row.events))


def _delivery(d: DeliveryRow) -> DeliveryOut:
    return DeliveryOut(deliveryID=d.delivery_id, eventID=d.event_id, type=d.event_type,
                       status=d.status, attempts=d.attempts, lastStatus=d.last_status,
                       lastError=d.last_error, createdAt=iso(d.created_at, "milliseconds"),
                       nextAttemptAt=iso(d.next_at, "milliseconds")
                       if d.status == "pending" else None,
                       doneAt=iso(d.done_at, "milliseconds") if d.done_at else None)


@router.post("/events/webhooks", status_code=201, response_model=WebhookOut)
async def create_webhook(body: NewWebhook, node: NodeDep, caller: CallerDep) -> WebhookOut:
    return _out(await node.webhooks.create(
        caller.team_id, name=body.name, url=body.url, enabled=body.enabled,
        events=body.events, secret=body.signatureSecret))


@router.get("/events/webhooks", response_model=list[WebhookOut])
async def list_webhooks(node: NodeDep, caller: CallerDep) -> list[WebhookOut]:
    return [_out(r) for r in await node.webhooks.defs.of_team(caller.team_id)]


@router.get("/events/webhooks/{webhook_id}", response_model=WebhookOut)
async def get_webhook(webhook_id: str, node: NodeDep, caller: CallerDep) -> WebhookOut:
    return _out(await node.webhooks.get(caller.team_id, webhook_id))


@router.patch("/events/webhooks/{webhook_id}", response_model=WebhookOut)
async def update_webhook(webhook_id: str, body: WebhookUpdate, node: NodeDep,
                         caller: CallerDep) -> WebhookOut:
    return _out(await node.webhooks.update(
        caller.team_id, webhook_id, name=body.name, url=body.url, enabled=body.enabled,
        events=body.events, secret=body.signatureSecret))


@router.delete("/events/webhooks/{webhook_id}", status_code=204)
async def delete_webhook(webhook_id: str, node: NodeDep, caller: CallerDep) -> Response:
    await node.webhooks.delete(caller.team_id, webhook_id)
    return Response(status_code=204)


@router.get("/events/webhooks/{webhook_id}/deliveries", response_model=list[DeliveryOut])
async def webhook_deliveries(webhook_id: str, node: NodeDep, caller: CallerDep,
                             limit: Annotated[int, Query(ge=1, le=1000)] = 100
                             ) -> list[DeliveryOut]:
    await node.webhooks.get(caller.team_id, webhook_id)
    return [_delivery(d) for d in await node.webhooks.outbox.deliveries(webhook_id, limit)]
