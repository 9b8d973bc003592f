"""Teams and their API keys (``/teams``, ``/api-keys``, ``/admin/teams/{id}/api-keys``;
docs/teams.md), in E2B's shapes.

``client.teams`` borrows an open :class:`~aenv.client.AsyncClient`'s connections, retries and
error conversion (``rest.py``). Who may do what is the node's: the client's key manages its
own team's keys; making and deleting teams, and another team's keys (``team_id=``), need the
node's operator key (else :class:`Unauthenticated`, 403).

A key's value is in the answer that makes it (:class:`CreatedApiKey`, ``create``'s second
value) and nowhere else, ever: keep it then.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from aenv.client.errors import InvalidRequest, NotFound
from aenv.client.rest import NodeApi, json_of


@dataclass(frozen=True)
class Team:
    team_id: str
    name: str
    #: The node's first team: its operator key's; it cannot be deleted.
    is_default: bool
    #: aenv's own: the team's limits on the node (``maxSandboxes``, ``maxMemoryMB``,
    #: ``maxDiskMB``, ``startsPerSecond``), only those that are set.
    quota: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, raw: Any) -> Team:
        if not isinstance(raw, dict) or not isinstance(raw.get("teamID"), str):
            raise InvalidRequest(f"unexpected team in the node's answer: {raw!r}"[:300])
        quota = raw.get("quota")
        if not isinstance(quota, dict):
            quota = {}
        return cls(raw["teamID"], str(raw.get("name", "")), bool(raw.get("isDefault")),
                   {str(k): v for k, v in quota.items() if isinstance(v, int | float)})


@dataclass(frozen=True)
class ApiKey:
    """A team's API key as listed: its name and a mask, never its value."""

    key_id: str
    name: str
    created_at: datetime
    last_used: datetime | None = None
    #: The value's first and last characters and its length (E2B's ``mask``).
    mask_prefix: str = ""
    mask_suffix: str = ""
    value_length: int = 0

    @property
    def masked(self) -> str:
        """The value as it may be shown: ``e2b_…1a2b``."""
        return f"{self.mask_prefix}…{self.mask_suffix}"

    @classmethod
    def from_wire(cls, raw: Any) -> ApiKey:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise InvalidRequest(f"unexpected API key in the node's answer: {raw!r}"[:300])
        mask = raw.get("mask")
        if not isinstance(mask, dict):
            mask = {}
        return cls(raw["id"], str(raw.get("name", "")), _time(raw.get("createdAt")),
                   _time(raw["lastUsed"]) if raw.get("lastUsed") else None,
                   str(mask.get("maskedValuePrefix") or mask.get("prefix") or ""),
                   str(mask.get("maskedValueSuffix") or ""), int(mask.get("valueLength") or 0))


@dataclass(frozen=True)
class CreatedApiKey(ApiKey):
    """A key just made: the only time its value is seen."""

    key: str = field(default="", repr=False, kw_only=True)

    @classmethod
    def from_wire(cls, raw: Any) -> CreatedApiKey:
        listed = ApiKey.from_wire(raw)
        if not isinstance(raw.get("key"), str) or not raw["key"]:
            raise InvalidRequest("the node's answer to a new API key holds no key")
        return cls(listed.key_id, listed.name, listed.created_at, listed.last_used,
                   listed.mask_prefix, listed.mask_suffix, listed.value_length, key=raw["key"])


class Teams:
    """The node's teams and a team's API keys."""

    def __init__(self, api: NodeApi) -> None:
        # The client's own plumbing, so retries and errors are the client's.
        self._api = api

    # -- teams (the operator key; a team's key lists its own team) --

    async def list(self) -> builtins.list[Team]:
        """Every team for the operator key; a team's key sees its own team."""
        response = await self._api.request("GET", "teams", what="list teams", idempotent=True)
        return [Team.from_wire(t) for t in json_of(response, "list teams")]

    async def create(self, name: str, *, quota: Mapping[str, float] | None = None
                     ) -> tuple[Team, str]:
        """A new team and the value of its first API key (named ``default``): shown now
        only. ``quota``: ``maxSandboxes``, ``maxMemoryMB``, ``maxDiskMB``,
        ``startsPerSecond`` (docs/teams.md). A name taken is :class:`Conflict`."""
        what = f"create team {name!r}"
        body: dict[str, Any] = {"name": name}
        if quota is not None:
            body["quota"] = dict(quota)
        response = await self._api.request("POST", "teams", what=what, json=body,
                                           idempotent=False)
        raw = json_of(response, what)
        key = raw.get("apiKey") if isinstance(raw, dict) else None
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"{what}: the node's answer holds no API key")
        return Team.from_wire(raw), key

    async def delete(self, team_id: str) -> bool:
        """Delete a team and its keys; False if there was none of that id. :class:`Conflict`
        while it owns sandboxes, snapshots, templates or volumes."""
        try:
            await self._api.request("DELETE", f"teams/{_quoted(team_id)}",
                                    what=f"delete team {team_id}", idempotent=True)
        except NotFound:
            return False
        return True

    # -- API keys (the caller's team; ``team_id``: any team's, with the operator key) --

    async def list_keys(self) -> builtins.list[ApiKey]:
        """The caller's team's API keys, oldest first (the operator key itself is not one)."""
        response = await self._api.request("GET", "api-keys", what="list API keys",
                                           idempotent=True)
        return [ApiKey.from_wire(k) for k in json_of(response, "list API keys")]

    async def create_key(self, name: str, *, team_id: str | None = None) -> CreatedApiKey:
        """A new API key of the caller's team (of ``team_id``'s, through the admin route);
        its value is in the answer only."""
        what = f"create API key {name!r}"
        path = "api-keys" if team_id is None else f"admin/teams/{_quoted(team_id)}/api-keys"
        response = await self._api.request("POST", path, what=what, json={"name": name},
                                           idempotent=False)
        return CreatedApiKey.from_wire(json_of(response, what))

    async def rename_key(self, key_id: str, name: str) -> None:
        """Rename one of the caller's team's keys; :class:`NotFound` if it has none of that
        id."""
        await self._api.request("PATCH", f"api-keys/{_quoted(key_id)}",
                                what=f"rename API key {key_id}", json={"name": name},
                                idempotent=True)

    async def revoke_key(self, key_id: str, *, team_id: str | None = None) -> bool:
        """Revoke a key of the caller's team (of ``team_id``'s, through the admin route): it is
        refused from the node's next call on. False if there was none of that id."""
        path = (f"api-keys/{_quoted(key_id)}" if team_id is None
                else f"admin/teams/{_quoted(team_id)}/api-keys/{_quoted(key_id)}")
        try:
            await self._api.request("DELETE", path, what=f"revoke API key {key_id}",
                                    idempotent=True)
        except NotFound:
            return False
        return True


def _time(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise InvalidRequest(f"unexpected time in the node's answer: {value!r}"[:300]) from None


def _quoted(value: str) -> str:
    return quote(value, safe="")
