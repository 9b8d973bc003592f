"""Route header-less signed ``/files`` URLs (``download_url()``/``upload_url()``).

Those URLs carry no ``E2b-Sandbox-Id`` (e2b-compat §4.1.4): with one shared ``E2B_SANDBOX_URL``
the only thing naming the sandbox is the signature, made with that sandbox's envd token. Trying
each running sandbox's token costs one SHA-256 per sandbox. envd itself still checks the
signature (and its expiry) after routing.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from starlette.types import Scope

from aenv.envd import DEFAULT_PORT
from aenv.envd.signing import sign
from aenv.proxy.routing import Target
from aenv.store.models import SandboxRecord


def signed_files_target(scope: Scope, running: list[SandboxRecord]) -> Target | None:
    if scope.get("type") != "http" or scope.get("path") != "/files":
        return None
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    signature = (query.get("signature") or [None])[0]
    if not signature:
        return None
    operation = "read" if scope["method"] in ("GET", "HEAD") else "write"
    path = (query.get("path") or [""])[0]
    username = (query.get("username") or [""])[0]
    raw_exp = (query.get("signature_expiration") or [None])[0]
    expiration = int(raw_exp) if raw_exp and raw_exp.lstrip("-").isdigit() else None
    for record in running:
        expected = sign(path, operation, username, record.envd_token, expiration)  # type: ignore[arg-type]
        if hmac.compare_digest(expected, signature):
            return Target(record.sandbox_id, DEFAULT_PORT)
    return None
