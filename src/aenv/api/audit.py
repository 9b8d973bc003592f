"""The audit log at the API's edge: every request that may change something is recorded as
it is answered (:class:`AuditMiddleware`), and ``GET /audit`` reads the log back
(``orchestrator/audit.py`` keeps it; docs/audit.md).

Who is the key presented (its hash's first 12 hex digits: the key itself is a secret and is
never written), or ``anonymous``; what is the method and the route's template; which object
is the route's id; from where is the client's address; the outcome is the status answered,
refusals (401, 404, 409…) included: a key trying what it may not do is what an audit is for.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aenv.api.auth import CallerDep, require_api_key
from aenv.orchestrator.context import Node
from aenv.orchestrator.tenancy import Caller
from aenv.store.models import AuditEntry

#: Methods that may change something; reads are not audited (they would drown the log).
AUDITED = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The path parameters that name an object, most specific first.
_OBJECT_PARAMS = ("sandbox_id", "snapshot_id", "template_id", "alias", "volume_id",
                  "build_id", "api_key_id", "access_token_id", "team_id")
#: The statuses of a create's answer (202: a template build accepted).
_CREATED = (201, 202)
#: The ids a create's answer names its new object by, most specific first.
_CREATED_KEYS = ("sandboxID", "snapshotID", "templateID", "volumeID", "buildID", "teamID",
                 "id")
#: An unmatched path is recorded as sent, cut to this.
_MAX_PATH = 200
#: A create's body is read for its object's id up to this (creates answer a few hundred bytes).
_MAX_BODY = 16 << 10


def actor_of(api_key: str | None) -> str:
    if not api_key:
        return "anonymous"
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:12]


def action_of(scope: Scope) -> tuple[str, str | None]:
    """The method and route template, and the object the route names (after routing)."""
    route = scope.get("route")
    template = getattr(route, "path", None) or str(scope.get("path", ""))[:_MAX_PATH]
    params: dict[str, Any] = scope.get("path_params") or {}
    object_id = next((str(params[p]) for p in _OBJECT_PARAMS if params.get(p)), None)
    return f"{scope['method']} {template}", object_id


def created_object(body: bytes) -> str | None:
    """The id a create's JSON answer names (a sandbox, template, build, snapshot, volume)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return next((str(data[k]) for k in _CREATED_KEYS if isinstance(data.get(k), str)), None)


class AuditMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in AUDITED:
            await self.app(scope, receive, send)
            return
        status = 0
        # A create names its object in its answer ({"sandboxID": …}): the start of a 201's
        # or 202's body is kept to read it from.
        body = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif status in _CREATED and len(body) < _MAX_BODY:
                body.extend(message.get("body", b"")[:_MAX_BODY])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            status = status or 500
            raise
        finally:
            self._record(scope, status, bytes(body))

    @staticmethod
    def _record(scope: Scope, status: int, body: bytes) -> None:
        node: Node = scope["app"].state.node
        headers = dict(scope.get("headers") or [])
        key = headers.get(b"x-api-key")
        action, object_id = action_of(scope)
        if object_id is None and body:
            object_id = created_object(body)
        client = scope.get("client")
        # Set by the routes' authentication (api/auth.py) when the key was one of the node's.
        caller: Caller | None = (scope.get("state") or {}).get("caller")
        node.audit.record(AuditEntry(
            at=node.clock(), actor=actor_of(key.decode("latin-1") if key else None),
            action=action, object_id=object_id, client=client[0] if client else None,
            status=status, team_id=caller.team_id if caller else None,
            key_name=caller.key_name if caller else None))


router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/audit")
async def read_audit(
    request: Request,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, description="entries older than this seq")] = None,
    object_id: Annotated[str | None, Query(alias="object", max_length=200)] = None,
    actor: Annotated[str | None, Query(max_length=100)] = None,
) -> dict[str, Any]:
    """The newest entries first; ``next`` is the ``before`` of the following page. A team
    reads its own entries; the operator key reads every team's."""
    node: Node = request.app.state.node
    entries = await node.audit.query(limit=limit, before=before, object_id=object_id,
                                     actor=actor,
                                     team_id=None if caller.operator else caller.team_id)
    return {"entries": [e.as_json() for e in entries],
            "next": entries[-1].seq if len(entries) == limit else None}
