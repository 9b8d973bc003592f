"""Reads the gateway answers from every node, not from the one a sandbox is bound to
(docs/logs.md and docs/webhooks.md, "In a cluster"): what they list was written on whichever
node the thing happened on.

* ``GET /v2/sandboxes/{id}/logs`` and ``GET /sandboxes/{id}/logs``: a sandbox that moved
  (paused on one node, resumed on another) left its entries on each, and a killed one is bound
  nowhere any more. Each reachable node answers its page (the same cursor, limit and
  direction); the pages are merged in time order and cut to ``limit`` — which is the page of
  the union, since no node left out an entry that comes before its own last one. Nodes that
  never had the sandbox answer 404 and are left out; all of them 404: 404.
* ``GET /events/webhooks/{id}/deliveries``: each node delivers its own sandboxes' events from
  its own outbox; the logs merged newest first.

A node that cannot be reached is left out; any other refusal (400, 401, 403) is the answer.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from aenv.cluster.fleet_metrics import Fetch, relay

LOGS = re.compile(r"^/(?:v2/)?sandboxes/[a-z0-9]{8,64}/logs$")
DELIVERIES = re.compile(r"^/events/webhooks/[^/]+/deliveries$")


async def _answers(fetch: Fetch, addresses: Sequence[str]
                   ) -> tuple[list[Any], Response | None]:
    """The nodes' 200 bodies; or the first refusal other than 404."""
    bodies: list[Any] = []
    for answer in await asyncio.gather(*(fetch(a, None, None) for a in addresses)):
        if answer is None or answer.status_code == 404:
            continue
        if answer.status_code != 200:
            return [], relay(answer)
        bodies.append(answer.json())
    return bodies, None


def _limit(request: Request, default: int) -> int:
    raw = request.query_params.get("limit", "")
    return int(raw) if raw.isdigit() else default


async def logs(fetch: Fetch, addresses: Sequence[str], request: Request) -> Response:
    bodies, refused = await _answers(fetch, addresses)
    if refused is not None:
        return refused
    if not bodies:
        return JSONResponse({"code": 404, "message": "sandbox not found"}, status_code=404)
    limit = _limit(request, 1000)
    newest_first = request.query_params.get("direction") == "backward"
    if request.url.path.startswith("/v2/"):
        entries = sorted((e for b in bodies for e in b["logs"]),
                         key=lambda e: e["timestamp"], reverse=newest_first)
        return JSONResponse({"logs": entries[:limit]})
    pairs = sorted((pair for b in bodies for pair in zip(b["logs"], b["logEntries"],
                                                         strict=True)),
                   key=lambda pair: pair[1]["timestamp"])[:limit]
    return JSONResponse({"logs": [line for line, _ in pairs],
                         "logEntries": [entry for _, entry in pairs]})


async def deliveries(fetch: Fetch, addresses: Sequence[str], request: Request) -> Response:
    bodies, refused = await _answers(fetch, addresses)
    if refused is not None:
        return refused
    if not bodies:
        return JSONResponse({"code": 404, "message": "webhook not found"}, status_code=404)
    merged = sorted((d for b in bodies for d in b), key=lambda d: d["createdAt"],
                    reverse=True)
    return JSONResponse(merged[:_limit(request, 100)])
