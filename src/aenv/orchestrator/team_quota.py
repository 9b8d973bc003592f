"""Per-team quotas on a node (docs/teams.md): running sandboxes, their memory, the disk of
running and paused sandboxes, and sandboxes started per second. A start that would go over is
refused with ``ResourceExhausted`` (429) and ``Retry-After``.

Starts race each other, so a start *reserves* what it needs before it begins and holds the
reservation until its sandbox is in the store as running. What a team uses is the store's
sandboxes that are up (not ``creating``: those are the reservations) plus the reservations.
Reading the store awaits, and a start can finish in between (its record written, then its
reservation dropped): a read during which any reservation of the team was dropped is read
again, so nothing is counted neither as a record nor as a reservation. A team's reads and
reservations are serialized by its lock; the starts themselves are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from aenv.core.errors import InvalidArgument, ResourceExhausted
from aenv.core.states import SandboxState
from aenv.store.models import SandboxRecord

if TYPE_CHECKING:
    from aenv.orchestrator.context import Node

#: Up, counted as running (``creating`` is counted by its reservation instead).
_RUNNING = (SandboxState.RUNNING, SandboxState.RESUMING, SandboxState.FORKING,
            SandboxState.SNAPSHOTTING, SandboxState.PAUSING)
#: Holding a disk: up, or paused.
_HOLDING_DISK = (*_RUNNING, SandboxState.PAUSED)
#: Re-reads of the store before counting the reservations dropped meanwhile as still held.
_REREADS = 5


@dataclass(frozen=True)
class Quota:
    """None: no limit."""

    max_sandboxes: int | None = None
    max_memory_mb: int | None = None
    max_disk_mb: int | None = None
    #: Sandboxes started per second (creates, fork children, resumes), with a burst of one
    #: second's worth (at least one).
    starts_per_s: float | None = None

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def as_json(self) -> dict[str, Any]:
        return {"maxSandboxes": self.max_sandboxes, "maxMemoryMB": self.max_memory_mb,
                "maxDiskMB": self.max_disk_mb, "startsPerSecond": self.starts_per_s}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> Quota:
        raw = raw or {}
        quota = cls(max_sandboxes=raw.get("maxSandboxes"), max_memory_mb=raw.get("maxMemoryMB"),
                    max_disk_mb=raw.get("maxDiskMB"), starts_per_s=raw.get("startsPerSecond"))
        for f in fields(quota):
            value = getattr(quota, f.name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float) or value <= 0):
                raise InvalidArgument(f"quota {f.name} must be a positive number or null")
        return quota


@dataclass
class _Reservation:
    count: int
    memory_mb: int
    disk_mb: int


@dataclass
class _Team:
    lock: asyncio.Lock
    held: list[_Reservation]
    #: Bumped each time a reservation is dropped.
    dropped: int = 0
    tokens: float = 0.0
    refilled_at: float = 0.0


class QuotaGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._teams: dict[str, _Team] = {}

    @contextlib.asynccontextmanager
    async def admit(self, quota: Quota, team: str, records: Callable[[], Any], *,
                    count: int, memory_mb: int, disk_mb: int) -> AsyncIterator[None]:
        """Inside: ``count`` starts of ``memory_mb`` and ``disk_mb`` each are reserved for
        ``team``. ``records``: an awaitable factory of the team's sandbox records.
        On failure: ``ResourceExhausted`` (429, ``Retry-After``); nothing reserved."""
        if quota.unlimited:
            yield
            return
        state = self._teams.get(team)
        if state is None:
            state = self._teams[team] = _Team(asyncio.Lock(), [], tokens=-1.0)
        reservation = _Reservation(count, memory_mb * count, disk_mb * count)
        async with state.lock:
            self._take_tokens(quota, state, count)
            running = memory = disk = 0
            for _ in range(_REREADS):
                seen = state.dropped
                found: list[SandboxRecord] = await records()
                up = [r for r in found if r.state in _RUNNING]
                running, memory = len(up), sum(r.memory_mb for r in up)
                disk = sum(r.disk_size_mb for r in found if r.state in _HOLDING_DISK)
                if state.dropped == seen:
                    break
            running += sum(r.count for r in state.held) + count
            memory += sum(r.memory_mb for r in state.held) + reservation.memory_mb
            disk += sum(r.disk_mb for r in state.held) + reservation.disk_mb
            for used, limit, what in ((running, quota.max_sandboxes, "running sandboxes"),
                                      (memory, quota.max_memory_mb, "MB of memory"),
                                      (disk, quota.max_disk_mb, "MB of disk")):
                if limit is not None and used > limit:
                    self._give_back(quota, state, count)
                    raise ResourceExhausted(
                        f"the team's quota of {limit:g} {what} is reached; stop or pause "
                        "some of its sandboxes", retry_after_s=5)
            state.held.append(reservation)
        try:
            yield
        finally:
            state.held.remove(reservation)
            state.dropped += 1

    def _take_tokens(self, quota: Quota, state: _Team, count: int) -> None:
        rate = quota.starts_per_s
        if rate is None:
            return
        burst = max(1.0, rate)
        now = self.clock()
        if state.tokens < 0:
            state.tokens, state.refilled_at = burst, now
        state.tokens = min(burst, state.tokens + (now - state.refilled_at) * rate)
        state.refilled_at = now
        if state.tokens < count:
            wait = math.ceil((count - state.tokens) / rate)
            raise ResourceExhausted(f"the team's quota of {rate:g} sandbox starts per second "
                                    "is reached", retry_after_s=max(1, wait))
        state.tokens -= count

    @staticmethod
    def _give_back(quota: Quota, state: _Team, count: int) -> None:
        if quota.starts_per_s is not None:
            state.tokens += count


@contextlib.asynccontextmanager
async def team_starts(node: Node, team_id: str | None, *, count: int,
                      memory_mb: int) -> AsyncIterator[None]:
    """:meth:`QuotaGate.admit` for ``count`` sandboxes of ``memory_mb`` started for the team
    ``team_id`` (None: the default team) on ``node``."""
    tenancy = node.tenancy
    key = team_id or tenancy.default_team_id

    async def records() -> list[SandboxRecord]:
        return [r for r in await node.store.list(_HOLDING_DISK)
                if (r.team_id or tenancy.default_team_id) == key]

    async with node.quotas.admit(await tenancy.quota_of(team_id), key, records, count=count,
                                 memory_mb=memory_mb, disk_mb=node.settings.disk_size_mb):
        yield
