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
* 429 ``{"code": 429, "error": "quota_exceeded", "message"}`` with ``Retry-After``: the
  request's ``key`` (the gateway's id of the caller's API key) holds its quota of sandboxes
  and reservations already (``--key-quota``; 0, the default, is none).
* 503 ``{"code": 503, "error": "no_nodes", "message"}``: no node has a fresh heartbeat.

``POST /v1/reservations/{id}/commit`` ``{"sandboxIDs"?}`` (the create succeeded; the ids
count against the key's quota until no node's roster holds them) and ``DELETE
/v1/reservations/{id}`` (it did not) answer 204 either way; an unknown id is not an error
(it expired, or was settled already). ``GET /v1/nodes``: every node with its health.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

from aenv.cluster import placement, registry, reserve, telemetry
from aenv.cluster.keys import Keys
from aenv.cluster.model import SUSPECT_AFTER_S, Health
from aenv.edge import errors

log = logging.getLogger("aenv.cluster.scheduler")

#: Seconds a caller told "cluster full" waits: about one heartbeat, when capacity may change.
FULL_RETRY_AFTER_S = 1
CLUSTER_FULL = "cluster_full"
QUOTA_EXCEEDED = errors.QUOTA_EXCEEDED
NO_NODES = "no_nodes"
#: How often a scheduler drops from the keys' quotas the sandboxes that ended on their own.
QUOTA_SWEEP_S = 10.0


class PlacementRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    template_id: str = Field("", alias="templateID")
    snapshot_id: str | None = Field(None, alias="snapshotID")
    origin: str | None = None
    count: int = Field(1, ge=1, le=1000)
    spread: bool = False
    host_key: str | None = Field(None, alias="hostKey")
    exclude: list[str] = Field(default_factory=list)
    key: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]+$",
                            description="the caller's API key id, for its quota")
    volumes: list[str] = Field(default_factory=list, max_length=64,
                               description="names of the volumes the sandbox mounts")

    def want(self) -> placement.Want:
        return placement.Want(
            template_id=self.template_id, snapshot_id=self.snapshot_id, origin=self.origin,
            host_key=self.host_key,
            exclude=frozenset(self.exclude), volumes=frozenset(self.volumes))


def _refusal(status: int, error: str, message: str, retry_after_s: int | None = None
             ) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse(errors.error_content(status, message, error=error),
                        status_code=status, headers=headers)


class CommitRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    sandbox_ids: list[str] = Field(default_factory=list, alias="sandboxIDs", max_length=1000)


def create_app(redis: Redis, keys: Keys | None = None, *, key_quota: int = 0) -> FastAPI:
    """The scheduler on ``redis`` (a client made with ``decode_responses=True``); each API
    key may hold ``key_quota`` sandboxes at most (0: no quota)."""
    keys = keys or Keys()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Always: gateways count fork children whatever the quota (they do not know it).
        sweep = asyncio.create_task(_sweep_quotas(redis, keys))
        yield
        sweep.cancel()
        await asyncio.gather(sweep, return_exceptions=True)
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

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        nodes, now = await registry.nodes(redis, keys)
        telemetry.set_nodes(nodes, now)
        return Response(generate_latest(telemetry.SCHEDULER), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/placements", status_code=201, response_model=None)
    async def place(body: PlacementRequest) -> dict[str, object] | JSONResponse:
        began = time.monotonic()
        answer = await _place(body)
        outcome = "ok" if isinstance(answer, dict) else \
            json.loads(bytes(answer.body)).get("error", "error")
        telemetry.PLACEMENTS.labels(outcome=outcome).inc()
        telemetry.PLACEMENT_SECONDS.observe(time.monotonic() - began)
        return answer

    async def _place(body: PlacementRequest) -> dict[str, object] | JSONResponse:
        nodes, now = await registry.nodes(redis, keys)
        if not any(n.health(now) in (Health.READY, Health.DRAINING) for n in nodes):
            return _refusal(503, NO_NODES, "no node of the cluster is reachable (no fresh "
                                           "heartbeat)")
        want = body.want()
        needed, grants, over_quota = body.count, [], False
        quota = key_quota
        for node in placement.candidates(nodes, want, now):
            grant = await reserve.reserve(
                redis, keys, node.node_id, uuid.uuid4().hex, needed,
                fresh_s=SUSPECT_AFTER_S, partial=body.spread, key_id=body.key,
                quota=quota)
            over_quota = over_quota or grant.reason == "quota"
            if grant.count:
                grants.append((node, grant))
                needed -= grant.count
                if needed == 0:
                    break
        if needed:
            for _, grant in grants:
                await reserve.cancel(redis, keys, grant.reservation_id)
            if over_quota:
                return _refusal(429, QUOTA_EXCEEDED,
                                f"this API key holds its quota of {quota} sandboxes "
                                "(running, paused or starting); kill some first",
                                FULL_RETRY_AFTER_S)
            return _refusal(429, CLUSTER_FULL,
                            f"the cluster has no room for {body.count} sandbox"
                            f"{'es' if body.count > 1 else ''} now; try again",
                            FULL_RETRY_AFTER_S)
        return {"placements": [
            {"nodeID": node.node_id, "address": node.address,
             "reservationID": grant.reservation_id, "count": grant.count}
            for node, grant in grants]}

    @app.post("/v1/reservations/{reservation_id}/commit", status_code=204)
    async def commit(reservation_id: str, body: CommitRequest | None = None) -> Response:
        await reserve.commit(redis, keys, reservation_id,
                             body.sandbox_ids if body is not None else ())
        return Response(status_code=204)

    @app.delete("/v1/reservations/{reservation_id}", status_code=204)
    async def cancel(reservation_id: str) -> Response:
        await reserve.cancel(redis, keys, reservation_id)
        return Response(status_code=204)

    return app


async def _sweep_quotas(redis: Redis, keys: Keys) -> None:
    """Every ``QUOTA_SWEEP_S``: sandboxes that ended on their own stop counting against
    their key (any replica may run it: it only removes what no roster holds)."""
    while True:
        await asyncio.sleep(QUOTA_SWEEP_S)
        try:
            await reserve.forget_gone(redis, keys)
        except RedisError as exc:
            log.warning("quota sweep failed: %s", exc)
