"""The gateway's side of E2B's fleet metrics routes (docs/metrics.md): one answer merged from
the nodes.

* ``GET /sandboxes/metrics?sandbox_ids=``: the request, unchanged, to every reachable node
  (each leaves out the ids it does not hold, and answers a bad list's 400; asking every
  node finds a sandbox wherever it is, moved or never bound); the maps merged.
* ``GET /teams/{id}/metrics``: the request to every reachable node; the series added point by
  point (the nodes sample at the same wall-clock instants and step alike for one interval).
* ``GET /teams/{id}/metrics/max``: the series as above, then the first point with the highest
  value of the metric asked for.

A node that cannot be reached is left out (its sandboxes show again when it answers); a node's
refusal (400, 403, 404) is the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from aenv.cluster import forward

#: Sends a GET of the request's path (or ``path``) and query to a node; its answer or None.
Fetch = Callable[[str, str | None, dict[str, str] | None], Awaitable[httpx.Response | None]]

_MAX_METRICS = ("concurrent_sandboxes", "sandbox_start_rate")


def fetcher(http: httpx.AsyncClient, request: Request) -> Fetch:
    """GETs to nodes with the caller's headers: ``request``'s path and query unless told."""
    headers = forward.request_headers(request)

    async def fetch(address: str, path: str | None = None,
                    params: dict[str, str] | None = None) -> httpx.Response | None:
        try:
            return await http.get(address.rstrip("/") + (path or request.url.path),
                                  params=params if params is not None
                                  else request.url.query, headers=headers)
        except httpx.TransportError:
            return None

    return fetch


async def sandboxes(fetch: Fetch, addresses: Sequence[str]) -> Response:
    """The nodes' ``{"sandboxes": {...}}`` maps, merged."""
    answers = await asyncio.gather(*(fetch(a, None, None) for a in addresses))
    merged: dict[str, Any] = {}
    for answer in answers:
        if answer is None:
            continue
        if answer.status_code != 200:
            return relay(answer)
        merged.update(answer.json().get("sandboxes") or {})
    return JSONResponse({"sandboxes": merged})


async def team(fetch: Fetch, addresses: Sequence[str], request: Request, *,
               maximum: bool) -> Response:
    """A team's series (or its maximum) over every node."""
    params = {k: v for k, v in request.query_params.items() if k in ("start", "end")}
    metric = request.query_params.get("metric")
    if maximum and metric not in _MAX_METRICS:
        return JSONResponse({"code": 400, "message": "metric must be one of "
                             + ", ".join(_MAX_METRICS)}, status_code=400)
    path = request.url.path.removesuffix("/max")
    answers = await asyncio.gather(*(fetch(a, path, params) for a in addresses))
    points: dict[int, dict[str, Any]] = {}
    for answer in answers:
        if answer is None:
            continue
        if answer.status_code != 200:
            return relay(answer)
        for p in answer.json():
            at = int(p["timestampUnix"])
            into = points.setdefault(at, {**p, "concurrentSandboxes": 0,
                                          "sandboxStartRate": 0.0})
            into["concurrentSandboxes"] += int(p["concurrentSandboxes"])
            into["sandboxStartRate"] = round(into["sandboxStartRate"]
                                             + float(p["sandboxStartRate"]), 6)
    series = [points[at] for at in sorted(points)]
    if not maximum:
        return JSONResponse(series)
    if not series:
        return JSONResponse({"code": 503, "message": "no node of the cluster answered"},
                            status_code=503)
    key = "concurrentSandboxes" if metric == "concurrent_sandboxes" else "sandboxStartRate"
    top = max(series, key=lambda p: p[key])
    return JSONResponse({"timestamp": top["timestamp"], "timestampUnix": top["timestampUnix"],
                         "value": top[key]})


def relay(answer: httpx.Response) -> Response:
    return Response(answer.content, status_code=answer.status_code,
                    media_type="application/json")
