"""Answers of the gateway's own, not a node's: E2B's error body, marked so the gateway
audits its own refusals (docs/audit.md) and not a node's (which the node audits)."""

from __future__ import annotations

from starlette.responses import Response

from aenv.edge.errors import error_body

OWN = "answered_by_gateway"


def mark_own(answer: Response) -> Response:
    setattr(answer, OWN, True)
    return answer


def own(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An answer of the gateway's own (not a node's), in E2B's body."""
    return mark_own(error_body(status, message, headers))
