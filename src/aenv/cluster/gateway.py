"""The gateway (``aenv gateway``, :8080): a node's E2B API and proxy surface over a cluster.

Stateless; any number of replicas. What it does with a request:

Creates, forks and resumes elsewhere are ``starts.py``'s; reads merged from every node are
``fleet_metrics.py``'s and ``fleet_reads.py``'s; the gateway routes to them.

* **Create** (``POST /sandboxes``, ``/v2/sandboxes``): asks a scheduler where
  (``POST /v1/placements``), sends the create to that node, commits the reservation and binds
  the new sandbox on a 201; cancels it otherwise. A node that answers 429 anyway (its own
  admission saw more than its heartbeat) is excluded and the next placement tried.
* **List** (``GET /sandboxes``, ``/v2/sandboxes``): the same query to every reachable node,
  the answers merged in the nodes' own order (start time, then id) and cut at ``limit``; the
  ``X-Next-Token`` is the nodes' keyset cursor of the page's last sandbox, so the next page
  continues on every node at once. ``X-Total-Running`` is the sum.
* **Fork** (``POST /sandboxes/{id}/fork``): the parent's node forks what fits; children it
  has no room for start on other nodes from a snapshot of the parent (``fork_spread.py``).
* **Read from every node** (``fleet_metrics.py``, ``fleet_reads.py``): many sandboxes'
  metrics, a team's, a sandbox's logs (kept on each node it ran on, and after its kill) and
  a webhook's deliveries (each node delivers its own sandboxes' events): merged.
* **Resume and connect** of a sandbox whose node is draining, lost, or refuses
  connections (it died): placed again (the old node excluded) and sent to the new node,
  which adopts the paused sandbox from the shared repository; the binding moves with the
  next fencing token.
  A sandbox that was *running* on a dead node is gone with it: the new node answers 404.
* **A sandbox's calls and traffic** (``/sandboxes/{id}/…``, and envd traffic by the
  ``E2b-Sandbox-Id`` header or a ``{port}-{id}.`` host): to the sandbox's node
  (``bindings.py``). A sandbox whose node is suspect or lost (``model.py``) answers 503 at
  once, one whose node does not accept a connection 503 after the connect timeout; never a
  hang.
* **Anything else** (templates, snapshots): to a ready node; every node serves the shared
  repository's templates and snapshots. A build-file upload is streamed to the first one, not
  buffered to be tried on the next.

Limits (``edge/limits.py``, docs/limits.md): the control plane's bodies are held to the nodes'
``max_body_bytes`` before anything is buffered here, sandbox traffic to
``proxy_max_body_bytes``; heads, header-read timeouts and slow connections per client are
bounded by the protocol ``aenv gateway`` serves with (``edge/protocol.py``).

API keys: the gateway checks the caller's credential on the control plane before it
reserves anything — the cluster's key (the nodes' operator key), or a team's key or token in
the cluster's team directory in Redis (``team_directory.py``, docs/teams.md), read on every
call so a revoked key is refused at once. The node checks the key again, which objects are
the team's, and the team's quotas against the cluster's ledger of its usage
(``team_usage.py``); a node's 429 for a quota is the caller's answer (no other node is
tried), and the gateway holds the team's ``startsPerSecond`` itself (``team_rate.py``).
What the gateway refuses itself (a changing request: a bad key, a quota, no node) goes into
the cluster's audit log (docs/audit.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from aenv.api.audit import actor_of
from aenv.api.listing import encode_cursor
from aenv.cluster import (
    bindings,
    fleet_metrics,
    fleet_reads,
    forward,
    reserve,
    telemetry,
)
from aenv.cluster.audit_store import RedisAuditStore
from aenv.cluster.cache import Binding, ClusterCache
from aenv.cluster.gateway_answers import OWN, own
from aenv.cluster.keys import Keys
from aenv.cluster.model import Health, NodeInfo
from aenv.cluster.scheduler_client import SchedulerClient
from aenv.cluster.starts import Starts, key_id
from aenv.cluster.team_directory import RedisDirectory
from aenv.core.errors import Unavailable
from aenv.core.settings import Settings
from aenv.edge.errors import error_body
from aenv.edge.limits import BodyLimits, guard, is_upload
from aenv.edge.request_ids import RequestIds
from aenv.orchestrator.audit import AuditTrail
from aenv.orchestrator.tenancy import digest_of, presented
from aenv.proxy import errors as proxy_errors
from aenv.proxy.routing import Target, route
from aenv.store.models import AuditEntry

_BY_ID = re.compile(r"^/(?:v\d+/)?sandboxes/([a-z0-9]{8,64})(?:/|$)")
_NOT_IDS = frozenset({"metrics"})
_LIST_PATHS = frozenset({"/sandboxes", "/v2/sandboxes"})
_FORK = re.compile(r"^/sandboxes/([a-z0-9]+)/fork$")
_TEAM_METRICS = re.compile(r"^/teams/[^/]+/metrics(?:/max)?$")
_RESUME = re.compile(r"^/(?:v\d+/)?sandboxes/[a-z0-9]+/(?:connect|resume)$")
log = logging.getLogger("aenv.cluster.gateway")


class Gateway:
    def __init__(self, redis: Redis, scheduler_url: str, api_key: str | None,
                 keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.api_key = api_key
        self.http = forward.client()
        self.scheduler = SchedulerClient(self.http, scheduler_url)
        self.cache = ClusterCache(redis, self.keys)
        self.directory = RedisDirectory(redis, self.keys)
        self.starts = Starts(self.http, self.scheduler, redis, self.keys, self.cache,
                             self._bind)
        #: Its own refusals, into the cluster's one log (docs/audit.md), bounded as a node's.
        self.audit = AuditTrail(RedisAuditStore(redis, AUDIT_KEEP, self.keys), AUDIT_KEEP)

    async def close(self) -> None:
        await self.http.aclose()
        await self.redis.aclose()

    # -- entry ------------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        began = time.monotonic()
        try:
            answer = await self._handle(request)
        except RedisError as exc:
            answer = own(503, f"the cluster's state store cannot be reached: {exc}",
                         {"Retry-After": "1"})
        except Unavailable as exc:
            answer = own(503, exc.message, {"Retry-After": "1"})
        if getattr(answer, OWN, False) and request.method in _AUDITED:
            self._audit(request, answer.status_code)
        name = "sandbox_traffic" if isinstance(route(request.scope), Target) \
            else telemetry.route_of(request.method, request.url.path)
        telemetry.GATEWAY_REQUESTS.labels(route=name,
                                          code=telemetry.code_class(answer.status_code)).inc()
        telemetry.GATEWAY_SECONDS.labels(route=name).observe(time.monotonic() - began)
        return answer

    def _audit(self, request: Request, status: int) -> None:
        """A changing request the gateway answered itself (a refusal: the key, a quota, no
        node): into the cluster's audit log, as a node records what it answers."""
        given = presented(request.headers)
        team = getattr(request.state, "team", None)
        self.audit.record(AuditEntry(
            at=time.time(), actor=actor_of(given.value if given else None),
            action=f"{request.method} {request.url.path[:200]}",
            object_id=match.group(1) if (match := _BY_ID.match(request.url.path)) else None,
            client=request.client.host if request.client else None, status=status,
            team_id=team.team_id if team is not None else None))

    async def _handle(self, request: Request) -> Response:
        target = route(request.scope)
        if isinstance(target, str):
            return own(400, target)
        if isinstance(target, Target):
            return await self._to_sandbox(request, target.sandbox_id, proxied=True)
        path = request.url.path
        if path == "/health":
            return JSONResponse({"status": "ok"})
        if path == "/metrics" and request.method == "GET":
            return self._prometheus(request)
        if path.startswith("/volumecontent/"):
            # Authorised by the volume's token, which any node checks (api/volume_tokens.py).
            return await self._to_any(request)
        if path.startswith("/dashboard"):
            # The dashboard's static page (api/dashboard.py): no key; its API calls carry one.
            return await self._to_any(request)
        if not await self._authorized(request):
            return own(401, "missing or invalid X-API-KEY")
        if path in _LIST_PATHS and request.method == "POST":
            return await self.starts.create(request)
        if path in _LIST_PATHS and request.method == "GET":
            return await self._list(request)
        if request.method == "GET" and (path == "/sandboxes/metrics"
                                        or _TEAM_METRICS.match(path)
                                        or fleet_reads.LOGS.match(path)
                                        or fleet_reads.DELIVERIES.match(path)):
            return await self._from_every_node(request)
        fork = _FORK.match(path)
        if fork and request.method == "POST":
            return await self.starts.fork(request, fork.group(1), self._to_sandbox)
        match = _BY_ID.match(path)
        if match and match.group(1) not in _NOT_IDS:
            answer = await self._to_sandbox(request, match.group(1))
            if request.method == "DELETE" and answer.status_code in (204, 404):
                await bindings.unbind(self.redis, self.keys, match.group(1))
                await reserve.forget(self.redis, self.keys, key_id(request), match.group(1))
                self.cache.forget(match.group(1))
            return answer
        return await self._to_any(request)

    def _prometheus(self, request: Request) -> Response:
        """The gateway's Prometheus metrics, for the cluster key (as ``X-API-KEY`` or a
        bearer, as Prometheus sends it); open when the gateway checks no keys."""
        if self.api_key is not None:
            bearer = request.headers.get("authorization", "")
            given = bearer[7:].strip() if bearer.lower().startswith("bearer ") \
                else request.headers.get("x-api-key", "")
            if not secrets.compare_digest(given.encode(), self.api_key.encode()):
                return own(401, "/metrics needs the cluster key")
        return Response(generate_latest(telemetry.GATEWAY), media_type=CONTENT_TYPE_LATEST)

    async def _authorized(self, request: Request) -> bool:
        """Whether the credential is the cluster's or a team's; the team (for its quota)
        is kept on ``request.state``."""
        request.state.team = None
        if self.api_key is None:
            return True
        given = presented(request.headers)
        if given is None:
            return False
        if secrets.compare_digest(given.value.encode(), self.api_key.encode()):
            team_id = given.as_team or await self.directory.default_team_id()
        else:
            row = await self.directory.credential(digest_of(given.value))
            if row is None or row.kind not in given.kinds:
                return False
            team_id = given.as_team if given.as_team and row.kind == "operator" \
                else row.team_id
        request.state.team = await self.directory.team(team_id) if team_id else None
        return True

    # -- routing ----------------------------------------------------------------------------

    async def _nodes(self) -> tuple[list[NodeInfo], int]:
        return await self.cache.nodes()

    async def _bind(self, sandbox_id: str, node_id: str, token: int) -> bool:
        won = await bindings.bind(self.redis, self.keys, sandbox_id, node_id, token)
        if won:
            self.cache.remember(sandbox_id, node_id, token)
        else:
            self.cache.forget(sandbox_id)
        return won

    async def _to_sandbox(self, request: Request, sandbox_id: str, *,
                          proxied: bool = False) -> Response:
        """``proxied``: traffic to the sandbox itself (envd, a port), which answers an unknown
        sandbox as a node's proxy does (502 "not found": ``is_running()`` reads it so)."""
        bound, cached = await self.cache.binding(sandbox_id)
        gone = 502 if proxied else 404
        if bound is None:
            if proxied:
                return proxy_errors.sandbox_not_found(sandbox_id)
            return own(404, f"sandbox {sandbox_id} not found")
        resume = request.method == "POST" and _RESUME.match(request.url.path) is not None
        body = await request.body() if resume else None
        answer = await self._to_bound(request, sandbox_id, bound, body)
        # A 404 by a cached binding: another gateway may have moved the sandbox since. Only
        # a request whose body is not consumed yet can go again.
        if (cached and isinstance(answer, httpx.Response) and answer.status_code == gone
                and (body is not None or request.method in ("GET", "HEAD", "DELETE"))):
            moved = await self.cache.moved(sandbox_id, bound)
            if moved is not None:
                await answer.aclose()
                answer = await self._to_bound(request, sandbox_id, moved, body)
        return forward.relay(answer) if isinstance(answer, httpx.Response) else answer

    async def _to_bound(self, request: Request, sandbox_id: str, bound: Binding,
                        body: bytes | None) -> Response | httpx.Response:
        """The node's answer (unread), or the gateway's own error."""
        nodes, now = await self._nodes()
        node = next((n for n in nodes if n.node_id == bound[0]), None)
        health = node.health(now) if node is not None else Health.LOST
        resume = body is not None
        if node is None or health is Health.LOST or (resume and health is Health.DRAINING):
            if resume:
                return await self.starts.resume_elsewhere(request, sandbox_id, bound)
            return own(503, f"sandbox {sandbox_id} was on node {bound[0]}, which is lost")
        if health is Health.SUSPECT:
            # A hung node accepts connections and answers nothing: no call may wait on it.
            return own(503, f"sandbox {sandbox_id} is on node {node.node_id}, which has not "
                            "sent a heartbeat for a while; try again", {"Retry-After": "2"})
        try:
            return await forward.send(self.http, request, node.address, body=body)
        except httpx.ConnectError:
            # Nothing listens there (the node died): a paused sandbox it published to the
            # shared repository can resume on another node.
            if resume:
                return await self.starts.resume_elsewhere(request, sandbox_id, bound, body)
            return own(503, f"sandbox {sandbox_id} is on node {node.node_id}, which does "
                            "not accept connections")
        except httpx.TransportError as exc:
            return own(503, f"sandbox {sandbox_id} is on node {node.node_id}, which cannot "
                            f"be reached: {type(exc).__name__}")

    async def _from_every_node(self, request: Request) -> Response:
        """Many sandboxes' metrics, or a team's (``fleet_metrics``), a sandbox's logs or a
        webhook's deliveries (``fleet_reads``): merged over the nodes."""
        nodes, now = await self._nodes()
        reachable = {n.node_id: n.address for n in nodes if n.health(now) is not Health.LOST}
        fetch = fleet_metrics.fetcher(self.http, request)
        if fleet_reads.LOGS.match(request.url.path):
            return await fleet_reads.logs(fetch, list(reachable.values()), request)
        if fleet_reads.DELIVERIES.match(request.url.path):
            return await fleet_reads.deliveries(fetch, list(reachable.values()), request)
        if request.url.path != "/sandboxes/metrics":
            return await fleet_metrics.team(fetch, list(reachable.values()), request,
                                            maximum=request.url.path.endswith("/max"))
        return await fleet_metrics.sandboxes(fetch, list(reachable.values()))

    async def _to_any(self, request: Request) -> Response:
        nodes, now = await self._nodes()
        ready = sorted((n for n in nodes if n.health(now) is Health.READY),
                       key=lambda n: n.running / max(n.limit, 1))
        if is_upload(request.scope) and ready:
            # Up to max_upload_bytes: streamed to one node, never held here to try another.
            try:
                return await forward.forward(self.http, request, ready[0].address)
            except httpx.TransportError:
                return own(503, f"node {ready[0].node_id} cannot be reached")
        body = await request.body()
        for node in ready:
            try:
                return await forward.forward(self.http, request, node.address, body=body)
            except httpx.TransportError:
                continue
        return own(503, "no node of the cluster is reachable")

    # -- list -------------------------------------------------------------------------------

    async def _list(self, request: Request) -> Response:
        nodes, now = await self._nodes()
        reachable = [n for n in nodes if n.health(now) is not Health.LOST]
        items: list[dict[str, object]] = []
        total = 0
        more = False  # a node has items past its page
        for node in reachable:
            try:
                answer = await self.http.get(node.address + request.url.path,
                                             params=request.url.query,
                                             headers=forward.request_headers(request))
            except httpx.TransportError:
                continue  # a node that does not answer lists nothing; its sandboxes show again
            if answer.status_code != 200:
                return Response(answer.content, status_code=answer.status_code,
                                media_type="application/json")
            items += answer.json()
            total += int(answer.headers.get("x-total-running", "0"))
            more = more or bool(answer.headers.get("x-next-token"))
        ascending = request.query_params.get("order") == "asc"
        items.sort(key=_order, reverse=not ascending)
        limit = request.query_params.get("limit")
        headers = {"X-Total-Running": str(total)}
        # The page is the first ``limit`` of the union (no node gave fewer than that unless it
        # had no more), so its last item is where every node goes on from.
        if limit and limit.isdigit() and items and (len(items) > int(limit) or more):
            items = items[: int(limit)]
            headers["X-Next-Token"] = encode_cursor(*_order(items[-1]))
        return JSONResponse(items, headers=headers)


def _order(item: dict[str, object]) -> tuple[float, str]:
    started = datetime.fromisoformat(str(item["startedAt"]).replace("Z", "+00:00"))
    return started.timestamp(), str(item["sandboxID"])


class _Limited:
    """Request bodies held to their limits before the gateway buffers any (edge/limits.py)."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if isinstance(route(scope), Target):
            limit, idle_s = self.limits.proxy, None
        else:
            limit, idle_s = self.limits.for_api(scope), self.limits.idle_s
        await guard(lambda r, s: self.app(scope, r, s), scope, receive, send, limit=limit,
                    idle_s=idle_s)


#: The cluster's log is trimmed to this many entries (the nodes' default
#: ``audit_max_entries``; whichever writes last trims).
AUDIT_KEEP = Settings.model_fields["audit_max_entries"].default
#: The methods whose refusals are audited (a node audits every changing request it answers).
_AUDITED = frozenset({"POST", "PUT", "PATCH", "DELETE"})
def create_app(redis: Redis, scheduler_url: str, api_key: str | None,
               keys: Keys | None = None, limits: BodyLimits | None = None) -> ASGIApp:
    """The gateway's ASGI app; ``limits``: the nodes' (None: the defaults)."""
    gateway = Gateway(redis, scheduler_url, api_key, keys)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        flushing = asyncio.create_task(gateway.audit.run_flush_loop(), name="gateway-audit")
        try:
            yield
        finally:
            flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flushing
            await gateway.audit.flush()
            await gateway.close()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    async def http_error(_: Request, exc: Exception) -> Response:
        # A body cut off at its limit (edge/limits.py) ends here: E2B's body, not plain text.
        assert isinstance(exc, HTTPException)
        return error_body(exc.status_code, str(exc.detail))

    app = Starlette(routes=[Route("/{path:path}", gateway.handle, methods=methods)],
                    lifespan=lifespan, exception_handlers={HTTPException: http_error})
    return RequestIds(_Limited(app, limits or BodyLimits()))
