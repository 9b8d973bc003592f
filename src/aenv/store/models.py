"""Rows as immutable records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from aenv.core.states import SandboxState


@dataclass(frozen=True)
class SandboxRecord:
    sandbox_id: str
    template_id: str
    state: SandboxState
    version: int
    created_at: float
    started_at: float
    end_at: float
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    envd_token: str
    client_id: str
    alias: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    auto_resume: bool = False
    #: What a pause at the end of the lifetime keeps: memory and files (true), or the files
    #: only (E2B ``autoPauseMemory: false``, on nodes with disk workspaces).
    auto_pause_memory: bool = True
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    #: The runtime driver's own view (runtime id, pid, net slot), as JSON.
    instance: dict[str, Any] | None = None
    state_changed_at: float = 0.0
    last_error: str | None = None
    #: Its volumes: ``[{"name", "path", "volume_id", "read_only"}]`` in the order given.
    volume_mounts: list[dict[str, Any]] | None = None
    #: The team that owns it (``orchestrator/tenancy.py``); None: the default team (a record
    #: from before teams).
    team_id: str | None = None
    #: E2B's ``iam`` tokens: ``[{"name", "audience", "token_type"}]``, which its egress rules
    #: may name (``orchestrator/workload_identity.py``); None: none.
    identity_tokens: list[dict[str, str]] | None = None

    def evolve(self, **changes: Any) -> SandboxRecord:
        return replace(self, **changes)


#: ``last_error`` of a record read from a row whose JSON column does not parse (a torn write, a
#: hand edit): the row is still readable, with that column empty, so one bad row can neither
#: stop a listing nor the node's recovery (which tears such a sandbox down).
UNREADABLE = "unreadable"

JSON_COLUMNS = {"metadata", "env_vars", "network", "instance", "volume_mounts",
                "identity_tokens"}
BOOL_COLUMNS = {"auto_pause", "auto_resume", "auto_pause_memory"}
COLUMNS = [f.name for f in fields(SandboxRecord)]


def to_row(record: SandboxRecord) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in COLUMNS:
        value = getattr(record, name)
        if name in JSON_COLUMNS:
            value = None if value is None else json.dumps(value, sort_keys=True)
        elif name in BOOL_COLUMNS:
            value = int(value)
        elif name == "allow_internet_access":
            value = None if value is None else int(value)
        elif name == "state":
            value = str(value)
        row[name] = value
    return row


def from_row(row: dict[str, Any]) -> SandboxRecord:
    values: dict[str, Any] = {}
    broken: list[str] = []
    for name in COLUMNS:
        value = row[name]
        if name in JSON_COLUMNS:
            try:
                value = None if value is None else json.loads(value)
            except ValueError as exc:
                broken.append(f"{name} ({exc})")
                value = None
            if value is None and name in ("metadata", "env_vars"):
                value = {}
        elif name in BOOL_COLUMNS:
            value = bool(value)
        elif name == "allow_internet_access":
            value = None if value is None else bool(value)
        elif name == "state":
            value = SandboxState(value)
        values[name] = value
    if broken:
        values["last_error"] = f"{UNREADABLE} " + ", ".join(broken)
    return SandboxRecord(**values)


@dataclass(frozen=True)
class AuditEntry:
    """One audited request (``orchestrator/audit.py``)."""

    at: float
    #: Who: the key that asked (``key:<id>``, a hash, never the key), or ``anonymous``.
    actor: str
    #: What: the method and the route's template, e.g. ``POST /sandboxes/{sandbox_id}/pause``.
    action: str
    #: Which object: the route's id (a sandbox, template, snapshot, volume or build), if any.
    object_id: str | None
    #: From where: the client's address as the node saw it.
    client: str | None
    #: The outcome: the HTTP status answered (0: the connection ended before an answer).
    status: int
    #: Its place in the log (assigned when written; 0 before).
    seq: int = 0
    #: The caller's team and key name, when the key was one of the node's.
    team_id: str | None = None
    key_name: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "actor": self.actor, "action": self.action,
                "objectID": self.object_id, "client": self.client, "status": self.status,
                "teamID": self.team_id, "keyName": self.key_name}


@dataclass(frozen=True)
class TeamRow:
    team_id: str
    name: str
    is_default: bool
    created_at: float
    #: Its quota as JSON (``orchestrator/team_quota.py``); None: none.
    quota: dict[str, Any] | None = None


@dataclass(frozen=True)
class CredentialRow:
    key_id: str
    team_id: str
    #: ``api_key``, ``access_token`` or ``operator`` (the node's own key: see tenancy.py).
    kind: str
    name: str
    #: SHA-256 of the value, hex.
    digest: str
    value_length: int
    masked_prefix: str
    masked_suffix: str
    created_at: float
    last_used: float | None = None


@dataclass(frozen=True)
class SecretRow:
    """A team's secret (``orchestrator/secrets.py``): ``sealed`` is its current value,
    encrypted; nothing else of it is secret."""

    secret_id: str
    team_id: str
    name: str
    current_version: int
    metadata: dict[str, str]
    created_at: float
    updated_at: float
    sealed: bytes = field(repr=False)
