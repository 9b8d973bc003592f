"""Which sandbox and port a request is for (e2b-compat §3.3, §6).

``E2b-Sandbox-Id`` + ``E2b-Sandbox-Port`` headers win (the SDK with ``E2B_SANDBOX_URL``); else a
Host of the form ``{port}-{sandboxID}.{domain}``. Control-plane requests carry neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.types import Scope

_HOST_RE = re.compile(r"^(\d{1,5})-([a-z0-9]+)\.")


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def route(scope: Scope) -> Target | str | None:
    """A target, ``None`` (not for a sandbox), or an error message for a malformed target."""
    sandbox_id = _header(scope, b"e2b-sandbox-id")
    port = _header(scope, b"e2b-sandbox-port")
    if sandbox_id is not None or port is not None:
        if not sandbox_id or not port or not port.isdigit() or not 0 < int(port) < 65536:
            return "both E2b-Sandbox-Id and a numeric E2b-Sandbox-Port are required"
        return Target(sandbox_id, int(port))
    host = _header(scope, b"host") or ""
    match = _HOST_RE.match(host)
    if match and 0 < int(match.group(1)) < 65536:
        return Target(match.group(2), int(match.group(1)))
    return None
