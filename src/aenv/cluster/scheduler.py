"""The scheduler's HTTP API (``aenv scheduler``, :9090): where a sandbox goes.

Any number of replicas, no leader: each reads the heartbeats, orders candidates
(``placement.py``) and reserves on Redis (``reserve.py``), whose scripts are what make
concurrent replicas agree. Callers are gateways.

``POST /v1/placements`` ``{"templateID", "snapshotID"?, "origin"?, "count"?, "spread"?,
"hostKey"?, "exclude"?}``:

* 201 ``{"placements": [{"nodeID", "address", "reservationID", "count"}]}``: the counts sum
  to ``count``; with ``spread`` (a fork) they may be on several nodes, else on one.
* 429 ``{"code": 429, "error": "cluster_full", "message"}`` with ``Retry-After``: every node
  that answers heartbeats is full, draining or at its limit of starts in flight (nothing is
  held: a partial spread is given back).
* 503 ``{"code": 503, "error": "no_nodes", "message"}``: no node has a fresh heartbeat.

``POST /v1/reservations/{id}/commit`` (the create succeeded) and ``DELETE
/v1/reservations/{id}`` (it did not) answer 204 either way; an unknown id is not an error
(it expired, or was settled already). ``GET /v1/nodes``: every node with its health.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from aenv.api import errors
from aenv.cluster import placement, registry, reserve
from aenv.cluster.keys import Keys
from aenv.cluster.model import SUSPECT_AFTER_S, Health

#: Seconds a caller told "cluster full" waits: about one heartbeat, when capacity may change.
FULL_RETRY_AFTER_S = 1
CLUSTER_FULL = "cluster_full"
NO_NODES = "no_nodes"


class PlacementRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    template_id: str = Field("", alias="templateID")
    snapshot_id: str | None = Field(None, alias="snapshotID")
    origin: str | None = None
    count: int = Field(1, ge=1, le=1000)
    spread: bool = False
    host_key: str | None = Field(None, alias="hostKey")
    exclude: list[str] = Field(default_factory=list)

    def want(self) -> placement.Want:
        return placement.Want(
            template_id=self.template_id, snapshot_id=self.snapshot_id, origin=self.origin,
            host_key=self.host_key,
            exclude=frozenset(self.exclude))


def _refusal(status: int, error: str, message: str, retry_after_s: int | None = None
             ) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse({"code": status, "error": error, "message": message},
                        status_code=status, headers=headers)


def create_app(redis: Redis, keys: Keys | None = None) -> FastAPI:
    """The scheduler on ``redis`` (a client made with ``decode_responses=True``)."""
    keys = keys or Keys()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await redis.aclose()

    app = FastAPI(title="aenv scheduler", lifespan=lifespan)
    errors.install(app)

    @app.exception_handler(RedisError)
    async def _redis_down(_: object, exc: RedisError) -> JSONResponse:
        return _refusal(503, NO_NODES, f"the cluster's state store cannot be reached: {exc}", 1)

    @app.get("/health")
    async def health() -> dict[str, str]:
        await redis.ping()
        return {"status": "ok"}

    @app.get("/v1/nodes")
    async def list_nodes() -> list[dict[str, object]]:
        nodes, now = await registry.nodes(redis, keys)
        return [{**n.model_dump(), "health": n.health(now).value,
                 "heartbeatAgeMs": now - n.heartbeat_ms} for n in nodes]

    @app.post("/v1/placements", status_code=201, response_model=None)
    async def place(body: PlacementRequest) -> dict[str, object] | JSONResponse:
        nodes, now = await registry.nodes(redis, keys)
        if not any(n.health(now) in (Health.READY, Health.DRAINING) for n in nodes):
            return _refusal(503, NO_NODES, "no node of the cluster is reachable (no fresh "
                                           "heartbeat)")
        want = body.want()
        needed, grants = body.count, []
        for node in placement.candidates(nodes, want, now):
            grant = await reserve.reserve(
                redis, keys, node.node_id, uuid.uuid4().hex, needed,
                fresh_s=SUSPECT_AFTER_S, partial=body.spread)
            if grant.count:
                grants.append((node, grant))
                needed -= grant.count
                if needed == 0:
                    break
        if needed:
            for _, grant in grants:
                await reserve.cancel(redis, keys, grant.reservation_id)
            return _refusal(429, CLUSTER_FULL,
                            f"the cluster has no room for {body.count} sandbox"
                            f"{'es' if body.count > 1 else ''} now; try again",
                            FULL_RETRY_AFTER_S)
        return {"placements": [
            {"nodeID": node.node_id, "address": node.address,
             "reservationID": grant.reservation_id, "count": grant.count}
            for node, grant in grants]}

    @app.post("/v1/reservations/{reservation_id}/commit", status_code=204)
    async def commit(reservation_id: str) -> Response:
        await reserve.commit(redis, keys, reservation_id)
        return Response(status_code=204)

    @app.delete("/v1/reservations/{reservation_id}", status_code=204)
    async def cancel(reservation_id: str) -> Response:
        await reserve.cancel(redis, keys, reservation_id)
        return Response(status_code=204)

    return app
