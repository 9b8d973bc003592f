"""Who is calling (e2b-compat §2.1; docs/teams.md): ``X-API-KEY`` (a team's key, or the node's
operator key), E2B's admin ``X-Admin-Token`` (the operator key) with ``X-Team-ID`` to act for
a team, or ``Authorization: Bearer`` with a team's access token. The caller is kept on the
request (``request.state.caller``) for the routes, the ownership checks and the audit log."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import Depends, Request

from aenv.core.errors import PermissionDenied, Unauthenticated
from aenv.orchestrator.tenancy import Caller, Tenancy, presented


def tenancy_of(request: Request) -> Tenancy:
    tenancy: Tenancy = request.app.state.node.tenancy
    return tenancy


async def identify(request: Request) -> Caller:
    tenancy = tenancy_of(request)
    given = presented(request.headers)
    if given is None:
        raise Unauthenticated("missing X-API-KEY header")
    caller = await tenancy.resolve(given.value, given.kinds)
    if caller is None:
        raise Unauthenticated("invalid API key")
    if given.as_team:
        caller = replace(caller, team_id=(await tenancy.team(given.as_team)).team_id)
    request.state.caller = caller
    return caller


async def require_api_key(request: Request) -> Caller:
    """Any credential of the node's: its team's objects only."""
    return await identify(request)


async def require_operator(request: Request) -> Caller:
    """The operator key only: teams and the node itself."""
    caller = await identify(request)
    if not caller.operator:
        raise PermissionDenied("this needs the node's operator key")
    return caller


CallerDep = Annotated[Caller, Depends(require_api_key)]
OperatorDep = Annotated[Caller, Depends(require_operator)]
