"""Volume tokens: what ``POST /volumes`` and ``GET /volumes/{id}`` hand out and the content API
takes as ``Authorization: Bearer``. The SDKs treat it as opaque (E2B's is a JWT); ours is
``v1.<volume id>.<expiry>.<hmac>``, keyed by the API key (every node of a cluster shares it),
so any node checks a token without state. It names one volume and expires."""

from __future__ import annotations

import hashlib
import hmac
import time

from aenv.core.errors import Unauthenticated

_PURPOSE = b"aenv volume token v1\n"


def mint(api_key: str, volume_id: str, ttl_s: int, now: float | None = None) -> str:
    expiry = int((time.time() if now is None else now) + ttl_s)
    return f"v1.{volume_id}.{expiry}.{_sign(api_key, volume_id, expiry)}"


def check(api_key: str, authorization: str | None, volume_id: str) -> None:
    """``Unauthenticated`` unless ``authorization`` is ``Bearer <a live token of volume_id>``."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthenticated("a volume token is required (Authorization: Bearer <token>)")
    parts = token.strip().split(".")
    if len(parts) != 4 or parts[0] != "v1" or not parts[2].isdigit():
        raise Unauthenticated("invalid volume token")
    _, named, expiry, signature = parts
    if not hmac.compare_digest(_sign(api_key, named, int(expiry)), signature):
        raise Unauthenticated("invalid volume token")
    if named != volume_id:
        raise Unauthenticated("the volume token is for another volume")
    if int(expiry) < time.time():
        raise Unauthenticated("the volume token has expired: get the volume again for a new one")


def _sign(api_key: str, volume_id: str, expiry: int) -> str:
    key = hmac.new(api_key.encode(), _PURPOSE, hashlib.sha256).digest()
    return hmac.new(key, f"{volume_id}.{expiry}".encode(), hashlib.sha256).hexdigest()
