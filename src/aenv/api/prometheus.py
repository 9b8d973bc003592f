"""``GET /metrics``: the node's Prometheus metrics (``core/telemetry.py``; docs/metrics.md,
"Prometheus"), for the operator: its key as ``X-API-KEY`` or, as Prometheus sends a
credential, ``Authorization: Bearer <operator key>``."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request, Response

from aenv.api.auth import require_operator
from aenv.core import telemetry

router = APIRouter()


async def require_scraper(request: Request) -> None:
    """The operator, by its key in ``X-API-KEY`` (or E2B's admin header) or as a bearer."""
    bearer = request.headers.get("authorization", "")
    operator: str = request.app.state.api_key
    if bearer.lower().startswith("bearer ") and secrets.compare_digest(
            bearer[7:].strip().encode(), operator.encode()):
        return
    await require_operator(request)


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    await require_scraper(request)
    body, content_type = telemetry.exposition()
    return Response(body, media_type=content_type)
