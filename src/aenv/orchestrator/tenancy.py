"""Teams, their keys, and which team owns what (docs/teams.md).

Every sandbox, snapshot, template, volume and build belongs to one team, and a team's keys see
and touch only its objects: anything else answers as if it did not exist (404), so a key
learns nothing of other teams. Who may do what:

* a **team key** (``X-API-KEY``; E2B's API keys, named, revocable, last-used time) or **access
  token** (``Authorization: Bearer``, E2B's deprecated user token) acts for its team;
* the **operator key** — the node's configured or generated ``api_key`` — is the default
  team's key, and also manages teams and the node (``/teams``, ``/node/*``, ``/repository``).
  So an install from before teams keeps working: its key is the first team's.

Keys are stored as SHA-256 digests: a value is shown once, when made. Teams and keys live in
a directory (``team_directory.py``): the node's SQLite database held in memory, or in cluster
mode the cluster's Redis, read on every lookup; either way a revoked key fails on the next
call, on every node.

Ownership: a sandbox's team is in its record, a snapshot's and a volume's in its manifest in
the repository (so they travel between nodes); a template's is in the ``owned`` table. An
object without a team is the default team's (made before teams), except a template: an
unowned template is the node's own (``base``, ``code-interpreter-v1``), public to every
team, managed by the operator only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from aenv.core.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from aenv.core.ids import new_api_key
from aenv.orchestrator.team_directory import TeamDirectory
from aenv.orchestrator.team_quota import Quota
from aenv.store.models import CredentialRow, TeamRow
from aenv.store.tenancy import TenancyStore

log = logging.getLogger("aenv.orchestrator.tenancy")

DEFAULT_TEAM_NAME = "default"
#: The ``owned`` row that records that this node's templates from before teams were adopted.
_ADOPTED = "adopted"
#: What a default team's template image is written with (``template_team``).
DEFAULT_TEAM_MARK = "default"
#: A key's last use is written at most this often (it is kept exact in memory).
LAST_USED_FLUSH_S = 30.0
#: How often the directory is checked for a lost default team or operator credential.
REPAIR_S = 10.0
MAX_NAME = 100


class CredentialKind(StrEnum):
    API_KEY = "api_key"
    ACCESS_TOKEN = "access_token"
    OPERATOR = "operator"


class Owned(StrEnum):
    """The kinds of object the ``owned`` table holds. A sandbox's, snapshot's or volume's
    team is written in its own record or manifest instead, which travels with it between
    nodes (a paused sandbox's manifest, the shared repository)."""

    TEMPLATE = "template"


@dataclass(frozen=True)
class Caller:
    """Who is asking: a team, through one of its credentials."""

    team_id: str
    key_id: str
    key_name: str
    #: The operator key: manages teams and the node, and sees the node's own templates.
    operator: bool = False


_KEYS = frozenset({CredentialKind.API_KEY, CredentialKind.OPERATOR})
_OPERATOR = frozenset({CredentialKind.OPERATOR})
_TOKENS = frozenset({CredentialKind.ACCESS_TOKEN})


@dataclass(frozen=True)
class Presented:
    """The credential a request carries: ``X-API-KEY`` (a team's key or the operator key),
    E2B's ``X-Admin-Token`` (the operator key; ``X-Team-ID`` names the team it acts for), or
    ``Authorization: Bearer`` (an access token)."""

    value: str
    kinds: frozenset[CredentialKind]
    as_team: str | None = None


def presented(headers: Mapping[str, str]) -> Presented | None:
    key = headers.get("x-api-key")
    if key is not None:
        return Presented(key, _KEYS)
    admin = headers.get("x-admin-token")
    if admin is not None:
        return Presented(admin, _OPERATOR, headers.get("x-team-id") or None)
    bearer = headers.get("authorization", "")
    if bearer.lower().startswith("bearer "):
        return Presented(bearer[7:].strip(), _TOKENS)
    return None


def digest_of(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def new_access_token_value() -> str:
    """Shaped like E2B's access tokens."""
    return "sk_e2b_" + secrets.token_hex(20)


def check_name(name: str, what: str) -> str:
    name = name.strip()
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise InvalidArgument(f"{what} name must be 1-{MAX_NAME} printable characters")
    return name


class Tenancy:
    def __init__(self, directory: TeamDirectory, owners: TenancyStore,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        #: The ``owned`` table (templates: kept per node).
        self.store = owners
        self.clock = clock
        self._owners: dict[tuple[str, str], str] = {}
        self._used: dict[str, float] = {}  # key id -> last use not yet written
        self.default_team_id = ""
        #: The operator credential, known without the directory: the node's own key works
        #: even while the cluster's Redis is down or was wiped.
        self._operator: CredentialRow | None = None
        #: Each team's quota as last read (what a start uses while the directory is down).
        self._quotas: dict[str, Quota] = {}

    # -- start -------------------------------------------------------------------------------

    async def start(self, operator_key: str, adopt_templates: Iterable[str] = ()) -> None:
        """Load; make the default team (unless the directory has one) and register
        ``operator_key`` as its operator credential, replacing an older one (the configured
        key changed). ``adopt_templates``: this node's template ids from before teams, which
        become the default team's (once: the adoption is recorded)."""
        await self.directory.start()
        self._owners = {(k, o): t for k, o, t in await self.store.owners()}
        default = await self.directory.ensure_default(
            TeamRow(str(uuid.uuid4()), DEFAULT_TEAM_NAME, True, self.clock()))
        self.default_team_id = default.team_id
        if (_ADOPTED, _ADOPTED) not in self._owners:
            for template_id in adopt_templates:
                if (Owned.TEMPLATE, template_id) not in self._owners:
                    await self.claim(Owned.TEMPLATE, template_id, default.team_id)
            await self.store.set_owner(_ADOPTED, _ADOPTED, default.team_id)
            self._owners[(_ADOPTED, _ADOPTED)] = default.team_id
        digest = digest_of(operator_key)
        for old in await self.directory.credentials(default.team_id):
            if old.kind == CredentialKind.OPERATOR and old.digest != digest:
                await self.directory.remove_credential(old)
        self._operator = await self.directory.credential(digest)
        if self._operator is None:
            self._operator = _credential_row(default.team_id, CredentialKind.OPERATOR,
                                             "operator", operator_key, self.clock())
            await self.directory.add_credential(self._operator)

    async def repair(self) -> None:
        """Put the default team and the operator credential back if the directory lost them
        (a cluster's Redis wiped): with the same id, so every node agrees on it again."""
        if self._operator is None:
            return
        team = await self.directory.team(self.default_team_id)
        if team is None:
            team = await self.directory.ensure_default(TeamRow(
                self.default_team_id, DEFAULT_TEAM_NAME, True, self.clock()))
            log.warning("the team directory had lost its default team: put back as %s",
                        team.team_id)
        if await self.directory.credential(self._operator.digest) is None:
            await self.directory.add_credential(self._operator)

    async def run_repair_loop(self) -> None:
        while True:
            await asyncio.sleep(REPAIR_S)
            await self.repair()

    # -- who is asking -----------------------------------------------------------------------

    async def resolve(self, value: str, kinds: frozenset[CredentialKind]) -> Caller | None:
        digest = digest_of(value)
        operator = self._operator
        row = (operator if operator is not None and operator.digest == digest
               else await self.directory.credential(digest))
        if row is None or row.kind not in kinds:
            return None
        self._used[row.key_id] = self.clock()
        return Caller(team_id=row.team_id, key_id=row.key_id, key_name=row.name,
                      operator=row.kind == CredentialKind.OPERATOR)

    async def flush_last_used(self) -> None:
        used, self._used = self._used, {}
        if used:
            await self.directory.record_use(used)

    async def run_flush_loop(self) -> None:
        while True:
            await asyncio.sleep(LAST_USED_FLUSH_S)
            await self.flush_last_used()

    # -- teams -------------------------------------------------------------------------------

    async def teams(self) -> list[TeamRow]:
        return await self.directory.teams()

    async def team(self, team_id: str) -> TeamRow:
        team = await self.directory.team(team_id)
        if team is None:
            raise NotFound(f"team {team_id} not found")
        return team

    async def quota_of(self, team_id: str | None) -> Quota:
        """The quota of a team (None: the default team). The directory unreachable (a
        cluster's Redis down): the last quota read, so starts go on as before."""
        key = team_id or self.default_team_id
        try:
            team = await self.directory.team(key)
        except Unavailable:
            return self._quotas.get(key, Quota())
        quota = Quota.from_json(team.quota) if team is not None else Quota()
        self._quotas[key] = quota
        return quota

    async def set_quota(self, team_id: str, quota: Quota) -> TeamRow:
        team = await self.team(team_id)
        raw = None if quota.unlimited else quota.as_json()
        await self.directory.set_quota(team_id, raw)
        return replace(team, quota=raw)

    async def create_team(self, name: str, quota: Quota | None = None) -> tuple[TeamRow, str]:
        """A new team and its first API key (the value: shown once)."""
        name = check_name(name, "team")
        raw = None if quota is None or quota.unlimited else quota.as_json()
        team = TeamRow(str(uuid.uuid4()), name, False, self.clock(), raw)
        await self.directory.add_team(team)
        _, value = await self.create_credential(team.team_id, CredentialKind.API_KEY, "default")
        return team, value

    async def delete_team(self, team_id: str, owns_objects: bool) -> None:
        """Prerequisites: the team owns nothing (its sandboxes, snapshots, templates and
        volumes deleted first: ``Conflict`` otherwise; ``owns_objects`` says whether it owns
        any of what is not in the ``owned`` table); not the default team."""
        team = await self.team(team_id)
        if team.is_default:
            raise FailedPrecondition("the default team cannot be deleted")
        if owns_objects or self.owns_any(team_id):
            raise Conflict(f"team {team_id} still owns sandboxes, snapshots, templates or "
                           "volumes: delete them first")
        await self.directory.remove_team(team_id)

    # -- credentials -------------------------------------------------------------------------

    async def credentials(self, team_id: str, kind: CredentialKind) -> list[CredentialRow]:
        rows = [c for c in await self.directory.credentials(team_id) if c.kind == kind]
        return [replace(c, last_used=self._used[c.key_id]) if c.key_id in self._used else c
                for c in rows]

    async def create_credential(self, team_id: str, kind: CredentialKind,
                                name: str) -> tuple[CredentialRow, str]:
        await self.team(team_id)
        name = check_name(name, "key")
        value = new_api_key() if kind == CredentialKind.API_KEY else new_access_token_value()
        row = _credential_row(team_id, kind, name, value, self.clock())
        await self.directory.add_credential(row)
        return row, value

    async def _credential(self, team_id: str, key_id: str,
                          kind: CredentialKind) -> CredentialRow:
        for row in await self.directory.credentials(team_id):
            if row.key_id == key_id and row.kind == kind:
                return row
        raise NotFound(f"key {key_id} not found")

    async def rename_credential(self, team_id: str, key_id: str, kind: CredentialKind,
                                name: str) -> None:
        row = await self._credential(team_id, key_id, kind)
        await self.directory.rename_credential(row, check_name(name, "key"))

    async def revoke_credential(self, team_id: str, key_id: str, kind: CredentialKind) -> None:
        row = await self._credential(team_id, key_id, kind)
        self._used.pop(key_id, None)
        await self.directory.remove_credential(row)

    # -- ownership ---------------------------------------------------------------------------

    def owner(self, kind: Owned, object_id: str) -> str | None:
        return self._owners.get((kind, object_id))

    def owns(self, caller: Caller, kind: Owned, object_id: str) -> bool:
        """Whether ``caller``'s team owns the object (an unowned template, the node's own,
        is managed by the operator)."""
        owner = self._owners.get((kind, object_id))
        if owner is None:
            return caller.operator
        return owner == caller.team_id

    def is_team(self, caller: Caller, team_id: str | None) -> bool:
        """Whether an object written with ``team_id`` (None: from before teams, the default
        team's) is the caller's."""
        return (team_id or self.default_team_id) == caller.team_id

    def stamp(self, caller: Caller) -> str | None:
        """The team to write on an object the caller makes: None for the default team, as
        before teams (an older node reads it too)."""
        return None if caller.team_id == self.default_team_id else caller.team_id

    def template_team(self, template_id: str) -> str | None:
        """The team a template's image is written with: None for the node's own (unowned)
        templates, which every team may use (as images from before teams and the base
        image are); ``DEFAULT_TEAM_MARK`` for the default team's (its id differs between
        nodes that share a repository without a cluster); else the team's id."""
        owner = self._owners.get((Owned.TEMPLATE, template_id))
        if owner is None:
            return None
        return DEFAULT_TEAM_MARK if owner == self.default_team_id else owner

    def image_visible(self, caller: Caller, team_id: str | None) -> bool:
        """Whether a template image written with ``team_id`` (``template_team``) may be used
        by ``caller``."""
        if team_id is None:
            return True
        return self.is_team(caller, None if team_id == DEFAULT_TEAM_MARK else team_id)

    def owns_any(self, team_id: str) -> bool:
        return any(t == team_id and k != _ADOPTED for (k, _), t in self._owners.items())

    async def claim(self, kind: Owned, object_id: str, team_id: str) -> None:
        await self.store.set_owner(kind, object_id, team_id)
        self._owners[(kind, object_id)] = team_id

    async def release(self, kind: Owned, object_id: str) -> None:
        if self._owners.pop((kind, object_id), None) is not None:
            await self.store.drop_owner(kind, object_id)


def _credential_row(team_id: str, kind: CredentialKind, name: str, value: str,
                    now: float) -> CredentialRow:
    prefix = value[:4] if kind != CredentialKind.ACCESS_TOKEN else value[:7]
    return CredentialRow(
        key_id=str(uuid.uuid4()), team_id=team_id, kind=kind, name=name,
        digest=digest_of(value), value_length=len(value),
        masked_prefix=prefix, masked_suffix=value[-4:], created_at=now)


