"""``GET /snapshots`` paging and the ``SnapshotInfo`` shape (e2b-compat §2.4.9)."""

from __future__ import annotations

import base64
import binascii

from aenv.api.schemas import SnapshotInfo
from aenv.core.errors import InvalidArgument
from aenv.storage.manifest import SnapshotDraft, SnapshotManifest


def snapshot_info(m: SnapshotDraft) -> SnapshotInfo:
    # The SDK shows names; an unnamed snapshot is known by its id.
    return SnapshotInfo(snapshotID=m.snapshot_id, names=list(m.names) or [m.snapshot_id])


def _encode(m: SnapshotManifest) -> str:
    key = f"{m.created_at!r}__{m.snapshot_id}"
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def _decode(token: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        created, snapshot_id = raw.split("__", 1)
        return float(created), snapshot_id
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument("invalid nextToken") from exc


def snapshot_page(
    snapshots: list[SnapshotManifest], *, limit: int, token: str | None
) -> tuple[list[SnapshotManifest], str | None]:
    """``snapshots`` newest first → one page after ``token`` and the next page's token."""
    if token:
        after = _decode(token)
        snapshots = [
            s for s in snapshots
            if (s.created_at, s.snapshot_id) < after
        ]
    page = snapshots[:limit]
    more = len(snapshots) > limit
    return page, _encode(page[-1]) if more and page else None
