"""Inbound traffic to a sandbox's own ports, as E2B's ``network`` config shapes it.

- ``allowPublicTraffic: false``: a request to any port but envd's must carry the sandbox's
  traffic access token in ``e2b-traffic-access-token`` (envd's port has its own token); the
  create and connect answers hand it out as ``trafficAccessToken``. Without it, or with a wrong
  one, the proxy answers 403 and a paused sandbox is not auto-resumed. The token is an HMAC of
  the sandbox id keyed by the sandbox's own secret envd token: nothing more is stored, any
  node holding the record (a resume elsewhere) checks it, and each sandbox, fork children
  included, has its own.
- ``maskRequestHost``: the ``Host`` the user's server sees (``${PORT}`` becomes the port).

These keys belong to the sandbox for its life: ``PUT /sandboxes/{id}/network`` replaces the
egress rules only (:func:`keep_inbound`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from aenv.core.errors import InvalidArgument
from aenv.store.models import SandboxRecord

HEADER = "e2b-traffic-access-token"
#: The ``network`` keys about inbound traffic (the rest are egress rules).
INBOUND_KEYS = ("allowPublicTraffic", "maskRequestHost")
MAX_HOST = 255


def check(network: Mapping[str, Any] | None) -> None:
    """``InvalidArgument`` for inbound keys of the wrong kind (a create's ``network``)."""
    if not network:
        return
    public = network.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise InvalidArgument("network.allowPublicTraffic must be a boolean")
    mask = network.get("maskRequestHost")
    if mask is not None and (not isinstance(mask, str) or len(mask) > MAX_HOST
                             or any(c in mask for c in "\r\n\0 /")):
        raise InvalidArgument("network.maskRequestHost must be a host[:port] "
                              f"(at most {MAX_HOST} characters, ${{PORT}} allowed)")


def required(record: SandboxRecord) -> bool:
    return (record.network or {}).get("allowPublicTraffic") is False


def token_of(record: SandboxRecord) -> str:
    return hmac.new(record.envd_token.encode(), f"traffic:{record.sandbox_id}".encode(),
                    hashlib.sha256).hexdigest()


def token_for_client(record: SandboxRecord) -> str | None:
    """``trafficAccessToken`` of the create and connect answers: None when none is needed."""
    return token_of(record) if required(record) else None


def admits(record: SandboxRecord, presented: str | None) -> bool:
    if not required(record):
        return True
    return presented is not None and hmac.compare_digest(presented.encode(),
                                                         token_of(record).encode())


def masked_host(record: SandboxRecord, port: int) -> str | None:
    """The ``Host`` to send instead of the client's, if the sandbox asked for one."""
    mask = (record.network or {}).get("maskRequestHost")
    if not isinstance(mask, str) or not mask:
        return None
    return mask.replace("${PORT}", str(port))


def keep_inbound(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` egress rules with ``old``'s inbound keys kept."""
    return {**{k: v for k, v in (old or {}).items() if k in INBOUND_KEYS}, **new}
