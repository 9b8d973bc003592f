"""``GET /v2/sandboxes`` filters and cursor pagination (e2b-compat §2.4.3)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import unquote

from aenv.core.errors import InvalidArgument
from aenv.store.models import SandboxRecord

MAX_LIMIT = 100
_STATES = {"running", "paused"}


@dataclass(frozen=True)
class ListQuery:
    states: frozenset[str] | None
    metadata: dict[str, str]
    ascending: bool
    started_after: float | None
    template: str | None
    cursor: tuple[float, str] | None
    limit: int


def parse_metadata(raw: str | None) -> dict[str, str]:
    """E2B's triple-encoded ``k=v&k2=v2``: the framework decoded once; decode, split, decode."""
    if not raw:
        return {}
    pairs: dict[str, str] = {}
    for part in unquote(raw).split("&"):
        if not part:
            continue
        bits = part.split("=")
        if len(bits) != 2:
            raise InvalidArgument(f"invalid metadata filter {part!r}: expected key=value")
        pairs[unquote(bits[0])] = unquote(bits[1])
    return pairs


def parse_states(raw: str | list[str] | None) -> frozenset[str] | None:
    if not raw:
        return None
    values = raw if isinstance(raw, list) else [raw]
    states = {s.strip() for v in values for s in v.split(",") if s.strip()}
    bad = states - _STATES
    if bad:
        raise InvalidArgument(f"invalid state {sorted(bad)[0]!r}: use running or paused")
    return frozenset(states)


def parse_started_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InvalidArgument(f"invalid startedAfter {raw!r}: expected ISO 8601") from None


def as_reported(ts: float) -> float:
    """``ts`` as clients see it: rounded to the microsecond, like ``startedAt`` on the wire
    (``convert.iso``). ``startedAfter`` is inclusive, so a client passing back a sandbox's own
    ``startedAt`` must find it, even when the stored time was rounded *up* on the way out."""
    return datetime.fromtimestamp(ts, UTC).timestamp()


def encode_cursor(started_at: float, sandbox_id: str) -> str:
    """The keyset cursor after the sandbox started at ``started_at`` (as reported:
    ``as_reported``) with id ``sandbox_id``. Made from what the wire shows, so a cluster
    gateway merging several nodes' pages can write one the nodes accept."""
    raw = f"{started_at!r}__{sandbox_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str | None) -> tuple[float, str] | None:
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        started, _, sandbox_id = raw.partition("__")
        return float(started), sandbox_id
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("invalid nextToken") from None


def parse_limit(raw: int | None) -> int:
    if raw is None:
        return MAX_LIMIT
    if raw < 1 or raw > MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
    return raw


def apply(records: list[SandboxRecord], query: ListQuery) -> tuple[list[SandboxRecord], str | None]:
    """Filter, order and cut one page; returns the page and the next cursor (or None)."""
    selected = []
    for record in records:
        if query.states is not None and record.state.public not in query.states:
            continue
        if query.template and query.template not in (record.template_id, record.alias):
            continue
        if query.started_after is not None and as_reported(record.started_at) < query.started_after:
            continue
        if any(record.metadata.get(k) != v for k, v in query.metadata.items()):
            continue
        selected.append(record)
    # Ordered by the reported (microsecond) start time, so a cursor can be made from a page.
    def order(r: SandboxRecord) -> tuple[float, str]:
        return as_reported(r.started_at), r.sandbox_id

    selected.sort(key=order, reverse=not query.ascending)
    if query.cursor is not None:
        key = query.cursor
        if query.ascending:
            selected = [r for r in selected if order(r) > key]
        else:
            selected = [r for r in selected if order(r) < key]
    page = selected[: query.limit]
    more = len(selected) > query.limit
    return page, encode_cursor(*order(page[-1])) if more and page else None
