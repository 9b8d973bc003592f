"""The node's audit log (``GET /audit``, docs/audit.md): who did what to which object."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aenv.client.rest import NodeApi, json_of


@dataclass(frozen=True)
class AuditRecord:
    seq: int
    at: datetime
    #: ``key:<hash prefix>`` of the key that asked, or ``anonymous``.
    actor: str
    #: The method and the route, e.g. ``POST /sandboxes/{sandbox_id}/pause``.
    action: str
    object_id: str | None
    client: str | None
    #: The HTTP status answered (0: none was).
    status: int

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> AuditRecord:
        return cls(seq=int(raw["seq"]), at=datetime.fromtimestamp(float(raw["at"]), UTC),
                   actor=str(raw["actor"]), action=str(raw["action"]),
                   object_id=raw.get("objectID"), client=raw.get("client"),
                   status=int(raw["status"]))


async def read(api: NodeApi, *, limit: int = 100, object_id: str | None = None,
               actor: str | None = None, before: int | None = None) -> list[AuditRecord]:
    """The newest entries first, at most ``limit``; ``before`` pages back."""
    params = {k: v for k, v in (("limit", limit), ("object", object_id), ("actor", actor),
                                ("before", before)) if v is not None}
    response = await api.request("GET", "audit", what="read the audit log", idempotent=True,
                                 params=params)
    return [AuditRecord.from_wire(e) for e in json_of(response, "read the audit log")["entries"]]
