"""Where a sandbox starts in a cluster (the gateway's side, ``gateway.py``): a create placed
by a scheduler and sent to its node, tried on the next placement when that node cannot be
reached or its own admission refuses (a team's quota is every node's answer: not tried
again); a fork whose children the parent's node has no room for spread to other nodes
(``fork_spread.py``); a paused sandbox of a gone node resumed on another, its binding moved
with the next fencing token; and a team's ``startsPerSecond`` across the cluster
(``team_rate.py``) held before any of them."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable

import httpx
from redis.asyncio import Redis
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from aenv.cluster import fork_spread, forward, reserve
from aenv.cluster.cache import ClusterCache
from aenv.cluster.gateway_answers import mark_own, own
from aenv.cluster.keys import Keys
from aenv.cluster.model import Health
from aenv.cluster.scheduler_client import SchedulerClient
from aenv.cluster.team_rate import TeamRate
from aenv.edge.errors import QUOTA_HEADER
from aenv.store.models import TeamRow

#: Placements tried for one create before the gateway gives up with the node's 429.
CREATE_ATTEMPTS = 3
log = logging.getLogger("aenv.cluster.gateway")

#: Binds a sandbox to a node with a fencing token; False: another gateway's binding won.
Bind = Callable[[str, str, int], Awaitable[bool]]


class Starts:
    def __init__(self, http: httpx.AsyncClient, scheduler: SchedulerClient, redis: Redis,
                 keys: Keys, cache: ClusterCache, bind: Bind) -> None:
        self.http = http
        self.scheduler = scheduler
        self.redis = redis
        self.keys = keys
        self.cache = cache
        self.bind = bind
        self.rate = TeamRate(redis, keys)

    async def refused(self, request: Request, count: int) -> Response | None:
        """The team's ``startsPerSecond`` across the cluster (``team_rate.py``): a 429 when
        ``count`` more starts this second would pass it, else None (counted)."""
        team: TeamRow | None = getattr(request.state, "team", None)
        rate = (team.quota or {}).get("startsPerSecond") if team is not None else None
        if team is None or not rate or await self.rate.take(team.team_id, float(rate), count):
            return None
        return own(429, f"team {team.name} starts at most {rate} sandboxes a second "
                        "across the cluster", {"Retry-After": "1"})

    async def create(self, request: Request) -> Response:
        refused = await self.refused(request, 1)
        if refused is not None:
            return refused
        body = await request.body()
        try:
            wanted = json.loads(body or b"{}")
        except ValueError:
            wanted = None  # the node answers the malformed body with its own 400
        template, volumes = placement_fields(wanted)
        exclude: list[str] = []
        answer: Response | None = None
        for _ in range(CREATE_ATTEMPTS):
            placed = await self.scheduler.place(templateID=template, exclude=exclude,
                                                key=key_id(request), volumes=volumes)
            if isinstance(placed, Response):
                return mark_own(placed)  # the scheduler's refusal (a quota, no room)
            [placement] = placed
            reservation = placement["reservationID"]
            try:
                sent = await self.http.post(
                    placement["address"].rstrip("/") + request.url.path,
                    params=request.url.query, content=body,
                    headers=forward.request_headers(request))
            except httpx.TransportError:
                await self.scheduler.settle(reservation, commit=False)
                exclude.append(placement["nodeID"])
                continue
            answer = Response(sent.content, status_code=sent.status_code, headers={
                k: v for k, v in sent.headers.items()
                if k.lower() in ("content-type", "retry-after")})
            if sent.status_code == 201:
                sandbox_id = str(sent.json().get("sandboxID", ""))
                await self.scheduler.settle(reservation, commit=True,
                                            sandbox_ids=[sandbox_id] if sandbox_id else [])
                if sandbox_id:
                    await self.bind(sandbox_id, placement["nodeID"], 1)
                return answer
            await self.scheduler.settle(reservation, commit=False)
            if sent.status_code != 429 or sent.headers.get(QUOTA_HEADER):
                return answer  # a team's quota: every node would answer the same
            exclude.append(placement["nodeID"])
        if answer is None:
            return own(503, "no node of the cluster could be reached for the create")
        return answer

    async def fork(self, request: Request, parent_id: str,
                   to_sandbox: Callable[[Request, str], Awaitable[Response]]) -> Response:
        """The parent's node forks what fits; the rest go to other nodes (``fork_spread``)."""
        refused = await self.refused(request, fork_count(await request.body()))
        if refused is not None:
            return refused
        bound, _ = await self.cache.binding(parent_id)
        nodes, now = await self.cache.nodes()
        node = next((n for n in nodes if bound and n.node_id == bound[0]), None)
        if bound is None or node is None or node.health(now) is not Health.READY:
            return await to_sandbox(request, parent_id)
        body = await request.body()
        headers = forward.request_headers(request)
        try:
            sent = await self.http.post(node.address + request.url.path, content=body,
                                        headers=headers)
        except httpx.TransportError as exc:
            return own(503, f"sandbox {parent_id} is on node {node.node_id}, which cannot "
                            f"be reached: {type(exc).__name__}")
        if sent.status_code != 201:
            return Response(sent.content, status_code=sent.status_code,
                            media_type="application/json")
        try:
            wanted = json.loads(body or b"{}")
            timeout = wanted.get("timeout") if isinstance(wanted, dict) else None
        except ValueError:
            timeout = None
        # Each child's create is its own: a key the fork came with would make a node replay
        # its first child for the next (``api/idempotency.py``).
        send_headers = [(k, v) for k, v in headers
                        if k.lower() not in ("content-length", "idempotency-key")]

        async def send(method: str, base: str, path: str, payload: object) -> httpx.Response:
            return await self.http.request(method, base.rstrip("/") + path, json=payload,
                                           headers=send_headers)

        entries = sent.json()
        key = key_id(request)
        for entry in entries:
            child = entry.get("sandbox") or {}
            if child.get("sandboxID"):
                await self.bind(child["sandboxID"], node.node_id, 1)
                # Made by the parent's node without a reservation: counted here.
                await reserve.count(self.redis, self.keys, key, child["sandboxID"])
        entries, made = await fork_spread.spread(
            send, self.scheduler, parent_id=parent_id,
            parent_node=(node.node_id, node.address), entries=entries,
            timeout=timeout if isinstance(timeout, int) else None, key=key)
        for child_id, child_node in made:
            await self.bind(child_id, child_node, 1)
        return JSONResponse(entries, status_code=201)

    async def resume_elsewhere(self, request: Request, sandbox_id: str,
                                bound: tuple[str, int], body: bytes | None = None) -> Response:
        """Resume ``sandbox_id`` on another node (its node is gone): a placement with the
        old node excluded, the resume sent there (the node adopts the sandbox from the
        shared repository), then the binding moved with the next fencing token."""
        body = body if body is not None else await request.body()
        placed = await self.scheduler.place(origin=bound[0], exclude=[bound[0]])
        if isinstance(placed, Response):
            return placed
        [placement] = placed
        try:
            sent = await self.http.post(
                placement["address"].rstrip("/") + request.url.path, params=request.url.query,
                content=body, headers=forward.request_headers(request))
        except httpx.TransportError as exc:
            await self.scheduler.settle(placement["reservationID"], commit=False)
            return own(503, f"sandbox {sandbox_id}'s node is gone and node "
                            f"{placement['nodeID']} cannot be reached: {type(exc).__name__}")
        ok = sent.status_code in (200, 201)
        await self.scheduler.settle(placement["reservationID"], commit=ok)
        if ok and not await self.bind(sandbox_id, placement["nodeID"], bound[1] + 1):
            log.warning("sandbox %s was moved by another gateway at the same time", sandbox_id)
        return Response(sent.content, status_code=sent.status_code, headers={
            k: v for k, v in sent.headers.items() if k.lower() in ("content-type",)})


def key_id(request: Request) -> str:
    """What the caller's quota is counted under: its team (the hex of its id), or in a
    cluster without keys a hash of what it sent (never the key itself)."""
    team: TeamRow | None = getattr(request.state, "team", None)
    if team is not None:
        return team.team_id.replace("-", "")
    given = request.headers.get("x-api-key", "")
    return hashlib.sha256(given.encode()).hexdigest()[:16]


def fork_count(body: bytes) -> int:
    """A fork's children (E2B's ``count``, 1 by default); malformed counts as one (the node
    answers it)."""
    try:
        wanted = json.loads(body or b"{}")
    except ValueError:
        return 1
    count = wanted.get("count", 1) if isinstance(wanted, dict) else 1
    return count if isinstance(count, int) and 1 <= count <= 1024 else 1


def placement_fields(body: object) -> tuple[str, list[str]]:
    """A create body's template and the names of the volumes it mounts (what placement
    prefers nodes by); whatever is malformed counts as absent (the node answers it)."""
    if not isinstance(body, dict):
        return "", []
    mounts = body.get("volumeMounts")
    names = sorted({str(m["name"]) for m in mounts if isinstance(m, dict) and m.get("name")}
                   ) if isinstance(mounts, list) else []
    return str(body.get("templateID") or ""), names[:64]
