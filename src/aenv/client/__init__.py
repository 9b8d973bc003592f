"""``aenv.client``: an async client of an aenv node for programs that run many sandboxes.

Bounded, backed-off creates with idempotency keys; run-scoped labels that are cleaned up on
exit or signal; typed errors that keep infrastructure apart from the task. Commands and files
go through the official e2b SDK. ``aenv.client.sync.Client`` is the same for threads and Ray
actors. See ``docs/client.md``.

A client: it talks HTTP to a node and imports nothing of the node's own packages (an
import-linter contract in ``pyproject.toml``).
"""

from aenv.client.audit import AuditRecord
from aenv.client.backoff import Backoff
from aenv.client.client import AsyncClient, Forked, SandboxInfo, SnapshotInfo
from aenv.client.config import ClientConfig, Credentials, load_credentials, save_credentials
from aenv.client.errors import (
    CapacityError,
    ClientError,
    CommandFailed,
    Conflict,
    InfrastructureError,
    InvalidRequest,
    NotFound,
    SandboxLost,
    SandboxTimeout,
    TaskError,
    TemplateNotFound,
    Unauthenticated,
    Unavailable,
    UsageError,
)
from aenv.client.runs import RUN_LABEL
from aenv.client.sandbox import CommandResult, Sandbox
from aenv.client.teams import ApiKey, CreatedApiKey, Team, Teams
from aenv.client.volumes import VolumeEntry, VolumeInfo, Volumes

__all__ = [
    "RUN_LABEL",
    "ApiKey",
    "AsyncClient",
    "AuditRecord",
    "Backoff",
    "CapacityError",
    "ClientConfig",
    "ClientError",
    "CommandFailed",
    "CommandResult",
    "Conflict",
    "CreatedApiKey",
    "Credentials",
    "Forked",
    "InfrastructureError",
    "InvalidRequest",
    "NotFound",
    "Sandbox",
    "SandboxInfo",
    "SandboxLost",
    "SandboxTimeout",
    "SnapshotInfo",
    "TaskError",
    "Team",
    "Teams",
    "TemplateNotFound",
    "Unauthenticated",
    "Unavailable",
    "UsageError",
    "VolumeEntry",
    "VolumeInfo",
    "Volumes",
    "load_credentials",
    "save_credentials",
]
