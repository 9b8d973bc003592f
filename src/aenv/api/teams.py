"""Teams, API keys and access tokens, in E2B's shapes (``/teams``, ``/api-keys``,
``/access-tokens``, ``/admin/teams/{id}/api-keys``; ``orchestrator/tenancy.py``).

A key manages its own team's keys and tokens; the operator key (or E2B's ``X-Admin-Token``)
makes and deletes teams and any team's keys. A key's value is in the answer that makes it and
nowhere else, ever."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from aenv.api.auth import CallerDep, OperatorDep
from aenv.api.convert import iso
from aenv.api.node import NodeDep
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.team_quota import Quota
from aenv.orchestrator.tenancy import CredentialKind
from aenv.store.models import CredentialRow, TeamRow

router = APIRouter()


class QuotaBody(BaseModel):
    """aenv's own: a team's limits on a node (``orchestrator/team_quota.py``); null: none."""

    maxSandboxes: int | None = Field(default=None, gt=0)
    maxMemoryMB: int | None = Field(default=None, gt=0)
    maxDiskMB: int | None = Field(default=None, gt=0)
    startsPerSecond: float | None = Field(default=None, gt=0)

    def quota(self) -> Quota:
        return Quota.from_json(self.model_dump())


class TeamOut(BaseModel):
    teamID: str
    name: str
    #: E2B's field; a key is shown only when made (here: in ``POST /teams``'s answer).
    apiKey: str = ""
    isDefault: bool
    quota: QuotaBody = Field(default_factory=QuotaBody)


class NewTeam(BaseModel):
    name: str = Field(max_length=200)
    quota: QuotaBody | None = None


class TeamUpdate(BaseModel):
    quota: QuotaBody


class NamedBody(BaseModel):
    name: str = Field(max_length=200)


class Mask(BaseModel):
    prefix: str
    valueLength: int
    maskedValuePrefix: str
    maskedValueSuffix: str


class KeyOut(BaseModel):
    id: str
    name: str
    mask: Mask
    createdAt: str
    createdBy: None = None
    lastUsed: str | None = None


class CreatedKey(KeyOut):
    key: str


class CreatedToken(BaseModel):
    id: str
    name: str
    token: str
    mask: Mask
    createdAt: str


def _mask(row: CredentialRow) -> Mask:
    return Mask(prefix=row.masked_prefix, valueLength=row.value_length,
                maskedValuePrefix=row.masked_prefix, maskedValueSuffix=row.masked_suffix)


def _key_out(row: CredentialRow) -> KeyOut:
    return KeyOut(id=row.key_id, name=row.name, mask=_mask(row), createdAt=iso(row.created_at),
                  lastUsed=iso(row.last_used) if row.last_used else None)


def _team_out(team: TeamRow, key: str = "") -> TeamOut:
    return TeamOut(teamID=team.team_id, name=team.name, apiKey=key, isDefault=team.is_default,
                   quota=QuotaBody.model_validate(team.quota or {}))


# -- teams ------------------------------------------------------------------------------------

@router.get("/teams", response_model=list[TeamOut])
async def list_teams(node: NodeDep, caller: CallerDep) -> list[TeamOut]:
    """Every team for the operator; a team's own key sees its team."""
    teams = await node.tenancy.teams()
    return [_team_out(t) for t in teams if caller.operator or t.team_id == caller.team_id]


@router.post("/teams", status_code=201, response_model=TeamOut)
async def create_team(body: NewTeam, node: NodeDep, caller: OperatorDep) -> TeamOut:
    team, key = await node.tenancy.create_team(body.name,
                                               body.quota.quota() if body.quota else None)
    return _team_out(team, key)


@router.patch("/teams/{team_id}", response_model=TeamOut)
async def update_team(team_id: str, body: TeamUpdate, node: NodeDep,
                      caller: OperatorDep) -> TeamOut:
    """Set the team's quota (all of it: a field left out has no limit)."""
    return _team_out(await node.tenancy.set_quota(team_id, body.quota.quota()))


@router.delete("/teams/{team_id}", status_code=204)
async def delete_team(team_id: str, node: NodeDep, caller: OperatorDep) -> Response:
    records = await node.store.list()
    volumes = await node.volumes.list()
    snapshots = node.repository.list()
    # A record being killed is gone for clients; its release finishes on its own.
    owns = (any(r.team_id == team_id and r.state != SandboxState.KILLING for r in records)
            or any(v.team_id == team_id for v in volumes)
            or any(s.manifest.team_id == team_id for s in snapshots)
            or bool(await node.secrets.list(team_id, after=None, limit=1)))
    await node.tenancy.delete_team(team_id, owns_objects=owns)
    return Response(status_code=204)


# -- a team's API keys --------------------------------------------------------------------------

@router.get("/api-keys", response_model=list[KeyOut])
async def list_keys(node: NodeDep, caller: CallerDep) -> list[KeyOut]:
    return [_key_out(r) for r in await node.tenancy.credentials(caller.team_id,
                                                               CredentialKind.API_KEY)]


@router.post("/api-keys", status_code=201, response_model=CreatedKey)
async def create_key(body: NamedBody, node: NodeDep, caller: CallerDep) -> CreatedKey:
    return await _create_key(node, caller.team_id, body.name)


@router.patch("/api-keys/{api_key_id}", status_code=200)
async def rename_key(api_key_id: str, body: NamedBody, node: NodeDep,
                     caller: CallerDep) -> Response:
    await node.tenancy.rename_credential(caller.team_id, api_key_id, CredentialKind.API_KEY,
                                         body.name)
    return Response(status_code=200)


@router.delete("/api-keys/{api_key_id}", status_code=204)
async def revoke_key(api_key_id: str, node: NodeDep, caller: CallerDep) -> Response:
    await node.tenancy.revoke_credential(caller.team_id, api_key_id, CredentialKind.API_KEY)
    return Response(status_code=204)


@router.post("/admin/teams/{team_id}/api-keys", status_code=201, response_model=CreatedKey)
async def admin_create_key(team_id: str, body: NamedBody, node: NodeDep,
                           caller: OperatorDep) -> CreatedKey:
    return await _create_key(node, team_id, body.name)


@router.delete("/admin/teams/{team_id}/api-keys/{api_key_id}", status_code=204)
async def admin_revoke_key(team_id: str, api_key_id: str, node: NodeDep,
                           caller: OperatorDep) -> Response:
    await node.tenancy.team(team_id)
    await node.tenancy.revoke_credential(team_id, api_key_id, CredentialKind.API_KEY)
    return Response(status_code=204)


async def _create_key(node: Node, team_id: str, name: str) -> CreatedKey:
    row, value = await node.tenancy.create_credential(team_id, CredentialKind.API_KEY, name)
    return CreatedKey(**_key_out(row).model_dump(), key=value)


# -- access tokens (E2B's deprecated user tokens) -----------------------------------------------

@router.post("/access-tokens", status_code=201, response_model=CreatedToken)
async def create_token(body: NamedBody, node: NodeDep, caller: CallerDep) -> CreatedToken:
    row, value = await node.tenancy.create_credential(caller.team_id,
                                                      CredentialKind.ACCESS_TOKEN, body.name)
    return CreatedToken(id=row.key_id, name=row.name, token=value, mask=_mask(row),
                        createdAt=iso(row.created_at))


@router.delete("/access-tokens/{access_token_id}", status_code=204)
async def revoke_token(access_token_id: str, node: NodeDep, caller: CallerDep) -> Response:
    await node.tenancy.revoke_credential(caller.team_id, access_token_id,
                                         CredentialKind.ACCESS_TOKEN)
    return Response(status_code=204)
