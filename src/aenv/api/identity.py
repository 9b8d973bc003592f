"""Workload identity's public verification material (``orchestrator/workload_identity.py``;
docs/teams.md, "Workload identity (iam)"): the JWK set sandboxes' tokens verify with and the
OpenID Connect discovery document pointing at it, so a verifier (an AWS IAM OIDC provider,
a cloud's workload identity pool, your own service) configured with the issuer URL finds
the keys by itself.

Both routes answer without authentication: they hold public keys and the issuer's name,
nothing a caller could use to mint or read a token. The issuer is reached as
``node.identity`` (an :class:`~aenv.orchestrator.workload_identity.Issuer` on the node the
app serves, ``request.app.state.node``); the discovery document names the issuer's own URL,
never one built from the request's ``Host``, so a request cannot make a cache serve a
document pointing elsewhere.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from aenv.orchestrator.workload_identity import Issuer

router = APIRouter()

#: Verifiers may keep the documents this long; a changed operator key (a new ``kid``) is
#: seen within it, and a verifier meeting an unknown ``kid`` fetches the set again anyway.
CACHE_CONTROL = "public, max-age=300"


def issuer_of(request: Request) -> Issuer:
    issuer: Issuer = request.app.state.node.identity
    return issuer


IssuerDep = Annotated[Issuer, Depends(issuer_of)]


@router.get("/.well-known/jwks.json")
async def jwks(issuer: IssuerDep, response: Response) -> dict[str, Any]:
    response.headers["Cache-Control"] = CACHE_CONTROL
    return issuer.jwks()


@router.get("/.well-known/openid-configuration")
async def openid_configuration(issuer: IssuerDep, response: Response) -> dict[str, Any]:
    response.headers["Cache-Control"] = CACHE_CONTROL
    return issuer.openid_configuration()
