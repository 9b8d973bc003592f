"""The cluster's audit log in a Redis stream (``orchestrator/audit.py``'s :class:`AuditRows`):
every node appends what it served to one stream, so ``GET /audit`` on any node reads the
whole cluster's log, with the same pages and filters as a node's own (docs/audit.md).

Owns the ``audit`` stream and the ``audit-seq`` counter of ``keys.py`` and nothing else. An
entry's stream id is ``<seq>-0``: a batch is one Lua script that takes the next seqs from the
counter and ``XADD``s each entry under its own, so seqs grow by one per entry across every
node, are never reused, and a page's ``before`` is a stream range. Each ``XADD`` trims the
stream to about ``keep`` entries (``MAXLEN ~``: Redis drops whole nodes of the stream, so a
few more than ``keep`` may stay). If the counter alone is lost, the next batch goes on from
the stream's newest entry.

Entries are ordered as they were written, not as they were answered: two nodes' entries of
the same half second may be in either order (``at`` says when each was answered). A filtered
read walks the stream newest first in chunks of ``SCAN_CHUNK`` until it has ``limit``
matches: at most ``keep / SCAN_CHUNK`` round trips, each a short command, so a search never
holds Redis for long. Redis that cannot be reached is ``Unavailable`` (503).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, fields
from typing import cast

from redis.asyncio import Redis

from aenv.cluster.keys import Keys
from aenv.cluster.redis_client import reachable
from aenv.store.models import AuditEntry

#: Entries read per round trip by a filtered query.
SCAN_CHUNK = 1000
#: Entries per append script: a pending backlog (up to 10,000) is written in short scripts.
APPEND_CHUNK = 500
_FIELD = "entry"
#: What ``XREVRANGE`` answers (the client decodes replies to text).
_Entries = list[tuple[str, dict[str, str]]]
#: What an entry's JSON may give (a newer node's extra fields are left out).
_NAMES = frozenset(f.name for f in fields(AuditEntry)) - {"seq"}

# KEYS: audit, audit-seq; ARGV: keep, entry JSON... The last seq given.
_APPEND = """
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
if seq == 0 then
  local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if newest[1] then seq = tonumber(string.match(newest[1][1], '^(%d+)')) end
end
for i = 2, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], string.format('%d-0', seq),
             'entry', ARGV[i])
end
redis.call('SET', KEYS[2], string.format('%d', seq))
return seq
"""


_reachable = reachable("the cluster's audit log")


def _dump(entry: AuditEntry) -> str:
    written = asdict(entry)
    del written["seq"]
    return json.dumps(written)


def _seq(stream_id: str) -> int:
    return int(stream_id.partition("-")[0])


def _load(stream_id: str, values: dict[str, str]) -> AuditEntry:
    written = json.loads(values[_FIELD])
    return AuditEntry(**{k: v for k, v in written.items() if k in _NAMES},
                      seq=_seq(stream_id))


class RedisAuditStore:
    def __init__(self, redis: Redis, keep: int, keys: Keys | None = None) -> None:
        self.redis = redis
        #: The stream's length each append trims it to (about).
        self.keep = keep
        self.keys = keys or Keys()
        self._append = redis.register_script(_APPEND)

    async def close(self) -> None:
        await self.redis.aclose()

    @_reachable
    async def append(self, entries: Sequence[AuditEntry]) -> None:
        """Write ``entries`` in order, each the next seq of the cluster's log."""
        for start in range(0, len(entries), APPEND_CHUNK):
            await self._append(
                keys=[self.keys.audit, self.keys.audit_seq],
                args=[self.keep, *(_dump(e) for e in entries[start:start + APPEND_CHUNK])])

    @_reachable
    async def query(self, *, limit: int, before: int | None = None,
                    object_id: str | None = None, actor: str | None = None,
                    team_id: str | None = None) -> list[AuditEntry]:
        """Newest first: at most ``limit`` entries older than seq ``before``, of one object,
        one actor or one team if given."""
        def wanted(entry: AuditEntry) -> bool:
            return ((object_id is None or entry.object_id == object_id)
                    and (actor is None or entry.actor == actor)
                    and (team_id is None or entry.team_id == team_id))

        top = before - 1 if before is not None else None
        filtered = any(f is not None for f in (object_id, actor, team_id))
        chunk = max(limit, SCAN_CHUNK) if filtered else limit
        found: list[AuditEntry] = []
        while limit > 0 and (top is None or top >= 1):
            # An id without its sequence part is the highest of that seq: "<top>" is <top>-0.
            batch = cast(_Entries, await self.redis.xrevrange(
                self.keys.audit, max="+" if top is None else str(top), min="-", count=chunk))
            for stream_id, values in batch:
                entry = _load(stream_id, values)
                if wanted(entry):
                    found.append(entry)
                    if len(found) == limit:
                        return found
            if len(batch) < chunk:
                break
            top = _seq(batch[-1][0]) - 1
        return found

    @_reachable
    async def keep_newest(self, count: int) -> int:
        """Trim the stream to about the newest ``count`` entries; how many went."""
        return int(await self.redis.xtrim(self.keys.audit, maxlen=count, approximate=True))
