"""Who may use ``GET/POST /files``: the access token, or a URL signed with it (§4.1.4).

The SDK's ``download_url``/``upload_url`` sign ``path:operation:username:token[:expiration]``
with unpadded standard base64 of its SHA-256, prefixed ``v1_``; ``path`` and ``username`` are the
raw query values, before any path resolution. A request carrying ``X-Access-Token`` is judged by
that header alone, as E2B's envd does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Literal

from aenv.core.errors import InvalidArgument, Unauthenticated
from aenv.envd.state import EnvdState

Operation = Literal["read", "write"]

#: The exact message ``test_download_url_with_expired_signing`` asserts.
EXPIRED = "signature is already expired"


def sign(
    path: str, operation: Operation, username: str, token: str, expiration: int | None = None
) -> str:
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode("ascii").rstrip("=")


def check_file_access(
    state: EnvdState,
    operation: Operation,
    headers: Mapping[str, str],
    query: Mapping[str, str],
) -> None:
    """Allow the request or raise.

    On failure: :class:`Unauthenticated` for a wrong token, a missing or wrong signature, or an
    expired one; :class:`InvalidArgument` for a non-numeric ``signature_expiration``.
    """
    token = state.access_token
    if token is None:
        return
    presented = headers.get("x-access-token")
    if presented:
        if not state.token_matches(presented):
            raise Unauthenticated("access token present in header but does not match")
        return
    signature = query.get("signature")
    if signature is None:
        raise Unauthenticated("missing signature query parameter")
    raw_expiration = query.get("signature_expiration")
    expiration: int | None = None
    if raw_expiration is not None:
        try:
            expiration = int(raw_expiration)
        except ValueError:
            raise InvalidArgument("signature_expiration must be an integer") from None
    expected = sign(query.get("path", ""), operation, query.get("username", ""), token, expiration)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise Unauthenticated("invalid signature")
    if expiration is not None and expiration < time.time():
        raise Unauthenticated(EXPIRED)
