"""The node's one ASGI app: requests for a sandbox go to the proxy, the rest to the API."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from aenv.api import (
    audit,
    dashboard,
    identity,
    logs,
    metrics,
    node_status,
    prometheus,
    secrets,
    teams,
    templates,
    volumes,
    webhooks,
)
from aenv.api.routes import public, router
from aenv.core.states import SandboxState
from aenv.edge import errors
from aenv.edge.limits import BodyLimits, guard
from aenv.edge.request_ids import RequestIds
from aenv.orchestrator.context import Node
from aenv.proxy.app import Proxy
from aenv.proxy.errors import bad_target
from aenv.proxy.routing import Target, route
from aenv.proxy.signed import signed_files_target


def build_api(node: Node, api_key: str) -> FastAPI:
    api = FastAPI(title="aenv", version="0.1.0", docs_url=None, redoc_url=None)
    api.state.node = node
    api.state.api_key = api_key
    errors.install(api)
    api.include_router(public)
    api.include_router(dashboard.router)
    api.include_router(templates.uploads)
    # Before the sandbox routes: ``DELETE /templates/tags`` must not read as a template id.
    api.include_router(templates.router)
    # Before the sandbox routes: ``GET /sandboxes/metrics`` must not read as a sandbox id.
    api.include_router(metrics.router)
    api.include_router(router)
    api.include_router(logs.router)
    api.include_router(node_status.router)
    api.include_router(volumes.volumes)
    api.include_router(volumes.volume_content)
    api.include_router(audit.router)
    api.include_router(teams.router)
    api.include_router(secrets.router)
    api.include_router(identity.router)
    api.include_router(prometheus.router)
    api.include_router(webhooks.router)
    # Outside the routes (it reads the matched route afterwards), inside the error handlers'
    # responses (it records the status they answered).
    api.add_middleware(audit.AuditMiddleware)
    # Outermost: the audit, the routes and every task they start log under the request's id.
    api.add_middleware(RequestIds)
    return api


class NodeApp:
    """Dispatch on the E2B sandbox headers / host before any routing or auth."""

    def __init__(self, api: ASGIApp, proxy: Proxy, limits: BodyLimits | None = None) -> None:
        self.api = api
        self.proxy = proxy
        self.limits = limits or BodyLimits()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            target = route(scope)
            if isinstance(target, Target):
                await self._proxy(scope, receive, send, target)
                return
            if isinstance(target, str):
                if scope["type"] == "http":
                    await bad_target(target)(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
            if scope["type"] == "http" and scope["path"] == "/files":
                running = await self.proxy.node.store.list([SandboxState.RUNNING])
                signed = signed_files_target(scope, running)
                if signed is not None:
                    await self._proxy(scope, receive, send, signed)
                    return
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        await guard(lambda r, s: self.api(scope, r, s), scope, receive, send,
                    limit=self.limits.for_api(scope), idle_s=self.limits.idle_s)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """To the sandbox; an HTTP body held to the proxy's limit (edge/limits.py)."""
        if scope["type"] != "http":
            await self.proxy(scope, receive, send, target)
            return
        await guard(lambda r, s: self.proxy(scope, r, s, target), scope, receive, send,
                    limit=self.limits.proxy, idle_s=None)
