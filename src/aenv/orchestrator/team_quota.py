"""Per-team quotas on a node (docs/teams.md): running sandboxes, their memory, the disk of
running and paused sandboxes, and sandboxes started per second. A start that would go over is
refused with ``QuotaExceeded`` (429) and ``Retry-After``.

Starts race each other, so a start *reserves* what it needs before it begins and holds the
reservation until its sandbox is in the store as running. What a team uses is the store's
sandboxes that are up (not ``creating``: those are the reservations) plus the reservations.
Reading the store awaits, and a start can finish in between (its record written, then its
reservation dropped): a read during which any reservation of the team was dropped is read
again, so nothing is counted neither as a record nor as a reservation. A team's reads and
reservations are serialized by its lock; the starts themselves are not.

In cluster mode the same limits hold across the cluster (``SharedUsage``, in Redis:
``cluster/team_usage.py``): after the node's own check, a start holds what it needs in the
cluster's ledger, which adds every node's published usage of the team and every open hold.
A node publishes a team's usage after a start, a kill and a pause of its sandboxes, and of
every team at each heartbeat; each publication is stamped with the cluster's clock, read
*before* the node lists its store, so an older one never overwrites a newer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from aenv.core import telemetry
from aenv.core.errors import AenvError, InvalidArgument, QuotaExceeded
from aenv.core.states import SandboxState
from aenv.orchestrator.instance_codec import frozen
from aenv.store.models import SandboxRecord

if TYPE_CHECKING:
    from aenv.orchestrator.context import Node

log = logging.getLogger("aenv.orchestrator.team_quota")

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


@dataclass(frozen=True)
class Usage:
    """What a team holds (or a start needs): sandboxes up, their memory, and the disk of
    those up or paused."""

    count: int = 0
    memory_mb: int = 0
    disk_mb: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.count + other.count, self.memory_mb + other.memory_mb,
                     self.disk_mb + other.disk_mb)

    @classmethod
    def of(cls, records: Iterable[SandboxRecord]) -> Usage:
        """What ``records`` (one team's) hold; a ``creating`` one nothing (its start's
        reservation counts it)."""
        total = cls()
        for r in records:
            up = is_up(r)
            if up or r.state in _HOLDING_DISK:
                total += cls(int(up), r.memory_mb if up else 0, r.disk_size_mb)
        return total


def is_up(record: SandboxRecord) -> bool:
    """Whether the sandbox counts as up: running or in a lifecycle operation. A paused one
    being written to disk (``pausing`` and frozen) is paused to its user: it does not."""
    return record.state in _RUNNING and not (record.state == SandboxState.PAUSING
                                             and frozen(record.instance))


def usage_by_team(records: Iterable[SandboxRecord], default_team: str) -> dict[str, Usage]:
    """Every team's usage in ``records`` (a node's), a record without a team counted as
    ``default_team``'s; teams holding nothing are left out."""
    by_team: dict[str, list[SandboxRecord]] = {}
    for r in records:
        by_team.setdefault(r.team_id or default_team, []).append(r)
    used = {team: Usage.of(rs) for team, rs in by_team.items()}
    return {team: u for team, u in used.items() if u != Usage()}


class SharedUsage(Protocol):
    """The teams' usage across a cluster (``cluster/team_usage.py``). Any method may raise
    what its store raises when it cannot be reached; :class:`QuotaGate` then holds the
    node's own limits only."""

    async def clock_ms(self) -> int:
        """The cluster's clock, the one every publication is stamped with."""

    async def hold(self, team: str, quota: Quota, need: Usage) -> str:
        """Hold ``need`` for ``team`` if the cluster's usage plus it stays within ``quota``;
        the hold's token. Over: ``QuotaExceeded``, nothing held."""

    async def publish(self, team: str, mine: Usage, measured_ms: int, *,
                      release: str | None = None) -> None:
        """``team``'s usage on this node, measured after ``measured_ms``; ``release``: a
        hold this usage now counts (or that failed)."""

    async def publish_all(self, usage: Mapping[str, Usage], measured_ms: int) -> None:
        """Every team's usage on this node (a team left out: none)."""


@dataclass
class _Team:
    lock: asyncio.Lock
    held: list[Usage]
    #: Bumped each time a reservation is dropped.
    dropped: int = 0
    tokens: float = 0.0
    refilled_at: float = 0.0


Records = Callable[[], Any]


class QuotaGate:
    """``shared``: the cluster's ledger of the teams' usage (None: a node alone)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 shared: SharedUsage | None = None) -> None:
        self.clock = clock
        self.shared = shared
        self._teams: dict[str, _Team] = {}
        self._shared_failing = False

    @contextlib.asynccontextmanager
    async def admit(self, quota: Quota, team: str, records: Records, *,
                    count: int, memory_mb: int, disk_mb: int) -> AsyncIterator[None]:
        """Inside: ``count`` starts of ``memory_mb`` and ``disk_mb`` each are reserved for
        ``team``, on this node and in the cluster's ledger. ``records``: an awaitable factory
        of the team's sandbox records on this node.
        On failure: ``QuotaExceeded`` (429, ``Retry-After``); nothing reserved."""
        if quota.unlimited:
            yield
            return
        state = self._teams.get(team)
        if state is None:
            state = self._teams[team] = _Team(asyncio.Lock(), [], tokens=-1.0)
        reservation = Usage(count, memory_mb * count, disk_mb * count)
        async with state.lock:
            self._take_tokens(quota, state, count)
            used = Usage()
            for _ in range(_REREADS):
                seen = state.dropped
                used = Usage.of(await records())
                if state.dropped == seen:
                    break
            for held in state.held:
                used += held
            try:
                check(quota, used + reservation)
                hold = await self._hold_shared(team, quota, reservation)
            except QuotaExceeded:
                self._give_back(quota, state, count)
                raise
            state.held.append(reservation)
        try:
            yield
        finally:
            state.held.remove(reservation)
            state.dropped += 1
            if hold is not None:
                await self.publish(team, records, release=hold)

    async def _hold_shared(self, team: str, quota: Quota, need: Usage) -> str | None:
        if self.shared is None:
            return None
        try:
            hold = await self.shared.hold(team, quota, need)
        except QuotaExceeded:
            raise
        except Exception as exc:  # the cluster's store is down: the node's own limits hold
            self._shared_down("hold", exc)
            return None
        self._shared_failing = False
        return hold

    async def publish(self, team: str, records: Records, *, release: str | None = None
                      ) -> None:
        """Tell the cluster ``team``'s usage on this node now (``release``: the hold it
        counts from now); nothing without a cluster. Never raises: a publication missed is
        made good by the next heartbeat, a hold left by its expiry."""
        if self.shared is None:
            return
        try:
            measured = await self.shared.clock_ms()
            mine = Usage.of(await records())
            await self.shared.publish(team, mine, measured, release=release)
        except Exception as exc:
            self._shared_down("publish", exc)

    def _shared_down(self, what: str, exc: Exception) -> None:
        if not self._shared_failing:
            log.warning("the cluster's team usage cannot be reached (%s: %s): each node "
                        "holds the teams' quotas alone until it can", what, exc)
        self._shared_failing = True

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
            telemetry.REFUSALS.labels(reason="team_rate").inc()
            raise QuotaExceeded(f"the team's quota of {rate:g} sandbox starts per second "
                                "is reached", retry_after_s=max(1, wait))
        state.tokens -= count

    @staticmethod
    def _give_back(quota: Quota, state: _Team, count: int) -> None:
        if quota.starts_per_s is not None:
            state.tokens += count


def check(quota: Quota, used: Usage, where: str = "") -> None:
    """``QuotaExceeded`` if ``used`` (what is held with a start counted) passes ``quota``;
    ``where``: said after the limit (" across the cluster")."""
    for value, limit, what in ((used.count, quota.max_sandboxes, "running sandboxes"),
                               (used.memory_mb, quota.max_memory_mb, "MB of memory"),
                               (used.disk_mb, quota.max_disk_mb, "MB of disk")):
        if limit is not None and value > limit:
            telemetry.REFUSALS.labels(reason="team_quota").inc()
            raise QuotaExceeded(
                f"the team's quota of {limit:g} {what}{where} is reached; stop or pause "
                "some of its sandboxes", retry_after_s=5)


def _team_records(node: Node, key: str) -> Records:
    """An awaitable factory of the records of team ``key`` on ``node``."""
    tenancy = node.tenancy

    async def records() -> list[SandboxRecord]:
        return [r for r in await node.store.list(_HOLDING_DISK)
                if (r.team_id or tenancy.default_team_id) == key]

    return records


async def team_changed(node: Node, team_id: str | None) -> None:
    """A sandbox of ``team_id`` stopped counting (killed, paused): the cluster hears it now,
    not at the next heartbeat, if the team has a quota. Never raises."""
    if node.quotas.shared is None:
        return
    try:
        quota = await node.tenancy.quota_of(team_id)
    except AenvError:
        return
    if not quota.unlimited:
        key = team_id or node.tenancy.default_team_id
        await node.quotas.publish(key, _team_records(node, key))


@contextlib.asynccontextmanager
async def team_starts(node: Node, team_id: str | None, *, count: int,
                      memory_mb: int) -> AsyncIterator[None]:
    """:meth:`QuotaGate.admit` for ``count`` sandboxes of ``memory_mb`` started for the team
    ``team_id`` (None: the default team) on ``node``; once they started, they count in the
    team's start rate (``team_metrics.py``)."""
    tenancy = node.tenancy
    key = team_id or tenancy.default_team_id
    async with node.quotas.admit(await tenancy.quota_of(team_id), key,
                                 _team_records(node, key), count=count,
                                 memory_mb=memory_mb, disk_mb=node.settings.disk_size_mb):
        yield
    node.team_meter.started(key, count)
