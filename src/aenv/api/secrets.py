"""E2B's ``/secrets`` (orchestrator/secrets.py): a team's secrets, by id or name. No answer
ever carries a value."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from aenv.api.auth import CallerDep
from aenv.api.convert import iso
from aenv.api.node import NodeDep
from aenv.core.errors import InvalidArgument
from aenv.store.models import SecretRow

router = APIRouter()


class SecretOut(BaseModel):
    secretID: str
    name: str
    currentVersion: int
    metadata: dict[str, str]
    createdAt: str
    updatedAt: str


class NewSecret(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_-]+$")
    value: str = Field(min_length=1)
    metadata: dict[str, str] | None = None


class SecretUpdate(BaseModel):
    value: str = Field(min_length=1)
    metadata: dict[str, str] | None = None


def _out(row: SecretRow) -> SecretOut:
    return SecretOut(secretID=row.secret_id, name=row.name, currentVersion=row.current_version,
                     metadata=row.metadata, createdAt=iso(row.created_at),
                     updatedAt=iso(row.updated_at))


def _after(token: str | None) -> str | None:
    if not token:
        return None
    try:
        after = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument("invalid nextToken") from exc
    if not after.isprintable():  # a name is printable; SQLite refuses a NUL in a string
        raise InvalidArgument("invalid nextToken")
    return after


@router.get("/secrets", response_model=list[SecretOut])
async def list_secrets(node: NodeDep, caller: CallerDep, response: Response,
                       nextToken: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 100) -> list[SecretOut]:
    rows = await node.secrets.list(caller.team_id, after=_after(nextToken), limit=limit + 1)
    if len(rows) > limit:
        rows = rows[:limit]
        response.headers["X-Next-Token"] = base64.urlsafe_b64encode(
            rows[-1].name.encode()).decode().rstrip("=")
    return [_out(r) for r in rows]


@router.post("/secrets", status_code=201, response_model=SecretOut)
async def create_secret(body: NewSecret, node: NodeDep, caller: CallerDep) -> SecretOut:
    return _out(await node.secrets.create(caller.team_id, body.name, body.value, body.metadata))


@router.get("/secrets/{secret_id}", response_model=SecretOut)
async def get_secret(secret_id: str, node: NodeDep, caller: CallerDep) -> SecretOut:
    return _out(await node.secrets.get(caller.team_id, secret_id))


@router.post("/secrets/{secret_id}", response_model=SecretOut)
async def update_secret(secret_id: str, body: SecretUpdate, node: NodeDep,
                        caller: CallerDep) -> SecretOut:
    return _out(await node.secrets.update(caller.team_id, secret_id, body.value,
                                          body.metadata))


@router.delete("/secrets/{secret_id}", status_code=204)
async def delete_secret(secret_id: str, node: NodeDep, caller: CallerDep) -> Response:
    await node.secrets.delete(caller.team_id, secret_id)
    return Response(status_code=204)
