"""API-key authentication: clients send ``X-API-KEY`` (e2b-compat §2.1)."""

from __future__ import annotations

import hmac

from fastapi import Request

from aenv.core.errors import Unauthenticated


def require_api_key(request: Request) -> None:
    expected: str = request.app.state.api_key
    presented = request.headers.get("x-api-key")
    if presented is None:
        raise Unauthenticated("missing X-API-KEY header")
    if not hmac.compare_digest(presented.encode(), expected.encode()):
        raise Unauthenticated("invalid API key")
