"""Each team's samples (``orchestrator/team_metrics.py`` takes them): at a whole multiple of
the sample period, how many of its sandboxes were up and how many it started since the last
one. Written in one transaction per pass, read by interval, dropped past their keep."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aiosqlite

from aenv.store.transactions import transaction


@dataclass(frozen=True)
class TeamSample:
    team_id: str
    #: Unix seconds, a multiple of the sample period.
    at: int
    concurrent: int
    starts: int


class TeamSampleStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def append(self, samples: Sequence[TeamSample]) -> None:
        if not samples:
            return
        async with transaction(self._db):
            await self._db.executemany(
                "INSERT INTO team_samples (team_id, at, concurrent, starts) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (team_id, at) DO UPDATE SET concurrent = excluded.concurrent,"
                " starts = team_samples.starts + excluded.starts",
                [(s.team_id, s.at, s.concurrent, s.starts) for s in samples])

    async def between(self, team_id: str, start: int, end: int) -> list[TeamSample]:
        """The team's samples from ``start`` to ``end`` (Unix seconds, both included), in
        time order."""
        async with self._db.execute(
            "SELECT team_id, at, concurrent, starts FROM team_samples "
            "WHERE team_id = ? AND at BETWEEN ? AND ? ORDER BY at", (team_id, start, end)
        ) as cur:
            rows = await cur.fetchall()
        return [TeamSample(r[0], r[1], r[2], r[3]) for r in rows]

    async def drop_before(self, at: int) -> int:
        cur = await self._db.execute("DELETE FROM team_samples WHERE at < ?", (at,))
        return cur.rowcount
