"""Wire models of E2B's REST API, as the official SDKs send and parse them (e2b-compat.md §2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: A sandbox timeout on the wire, in seconds. Only the sign is checked here (a 400 naming the
#: field); the node's maximum is ``core/timeouts.py``'s, the one check every caller shares.
TimeoutSeconds = Annotated[int, Field(ge=0)]


class _In(BaseModel):
    # Clients send fields we do not act on (mcp, iam, ...): accept and ignore.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class AutoResume(_In):
    enabled: bool = False


class ForkOf(_In):
    """aenv's own (the SDKs never send it): the create restores a fork child on another node
    than its parent's, from a snapshot of the parent (``cluster/fork_spread.py``). Like a
    child forked on the parent's node, it continues the parent's boot (its boot id) and is
    of the parent's template."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=255)
    alias: str | None = Field(default=None, max_length=255)


class VolumeMountIn(_In):
    """One ``volumeMounts`` entry: a volume by name at an absolute path."""

    name: str = Field(max_length=255)
    path: str = Field(max_length=4096)
    #: aenv's own (the SDKs never send it): many sandboxes may mount a volume read-only, one
    #: read-write (docs/volumes.md).
    read_only: bool = Field(default=False, alias="readOnly")


class NewSandbox(_In):
    """``POST /v2/sandboxes`` (and v1 ``POST /sandboxes``, which adds ``secure``)."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=255)
    timeout: TimeoutSeconds | None = None
    #: None: the node's ``auto_pause_default``.
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    # E2B's one snake_case key.
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    #: Workload identity tokens (orchestrator/workload_identity.py checks the shape).
    iam: Any = None
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    secure: bool | None = None
    fork_of: ForkOf | None = Field(default=None, alias="forkOf")
    volume_mounts: list[VolumeMountIn] | None = Field(default=None, alias="volumeMounts",
                                                      max_length=32)


class NetworkUpdate(_In):
    """``PUT /sandboxes/{id}/network``: replaces the whole egress config."""

    allow_out: list[str] | None = Field(default=None, alias="allowOut")
    deny_out: list[str] | None = Field(default=None, alias="denyOut")
    allow_internet_access: bool | None = None
    dns_servers: list[str] | None = Field(default=None, alias="dnsServers")
    rules: dict[str, Any] | None = None
    egress_proxy: dict[str, Any] | None = Field(default=None, alias="egressProxy")


class TimeoutBody(_In):
    timeout: TimeoutSeconds


class ConnectBody(_In):
    timeout: TimeoutSeconds | None = None
    memory: bool | None = None


class RefreshBody(_In):
    duration: TimeoutSeconds | None = None


class ResumeBody(_In):
    timeout: TimeoutSeconds | None = None
    auto_pause: bool | None = Field(default=None, alias="autoPause")


class PauseBody(_In):
    #: false = filesystem only: honoured on nodes with disk workspaces; with the files in
    #: sandbox memory (workspace=memory) a pause keeps memory and files together.
    memory: bool | None = None
    require_healthy_guest: bool | None = Field(default=None, alias="requireHealthyGuest")


class SnapshotBody(_In):
    name: str | None = Field(default=None, min_length=1, max_length=128,
                             pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$")
    memory: bool | None = None


class ForkBody(_In):
    count: int = Field(default=1, ge=1)
    timeout: TimeoutSeconds | None = None


class SandboxOut(BaseModel):
    """``Sandbox``: what create and connect return."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    envdAccessToken: str | None = None
    trafficAccessToken: str | None = None
    domain: str | None = None
    alias: str | None = None


class Lifecycle(BaseModel):
    onTimeout: str
    autoResume: bool
    #: aenv's own: what a pause at the end of the lifetime keeps (false: the files only).
    autoPauseMemory: bool | None = None


class VolumeMountOut(BaseModel):
    name: str
    path: str
    #: aenv's own.
    readOnly: bool = False


class ListedSandbox(BaseModel):
    templateID: str
    alias: str | None = None
    sandboxID: str
    clientID: str
    startedAt: str
    endAt: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: str
    envdVersion: str
    metadata: dict[str, str] | None = None
    volumeMounts: list[VolumeMountOut] = Field(default_factory=list)


class LifecycleNow(BaseModel):
    """aenv's own (the SDKs ignore it): the lifecycle state as the node holds it, which
    E2B's ``state`` (only running or paused) cannot say."""

    #: ``core/states.py``: running, pausing, paused, resuming, snapshotting, forking.
    state: str
    #: The operation holding the sandbox now (``orchestrator/owners.py``), since when.
    operation: str | None = None
    operationSince: str | None = None
    #: The last operation on it that failed or was cut short, and why.
    lastError: str | None = None


class SandboxDetail(ListedSandbox):
    aenv: LifecycleNow | None = None
    envdAccessToken: str | None = None
    domain: str | None = None
    allowInternetAccess: bool | None = None
    network: dict[str, Any] | None = None
    #: The workload identity tokens its create asked for, as the create said them
    #: (``{"tokens": {<name>: {"audience", "tokenType"}}}``; no token itself); null: none.
    iam: dict[str, Any] | None = None
    lifecycle: Lifecycle | None = None
    #: Paused sandboxes: "full" (memory and files) or "filesystem" (files only: disk
    #: workspaces and ``memory: false``).
    pauseMode: Literal["full", "filesystem"] | None = None
    #: Paused sandboxes whose envd did not answer when the pause was asked for.
    envdUnresponsiveAtPause: bool | None = None
    #: aenv's own (the SDKs ignore it): a running sandbox whose envd does not answer now
    #: (``orchestrator/liveness.py``), why, and since when; absent while it answers.
    envdUnresponsive: bool | None = None
    envdUnresponsiveReason: str | None = None
    envdUnresponsiveSince: str | None = None


class SandboxMetric(BaseModel):
    timestamp: str
    timestampUnix: int
    cpuCount: int
    cpuUsedPct: float
    memUsed: int
    memTotal: int
    memCache: int
    diskUsed: int
    diskTotal: int


class SnapshotInfo(BaseModel):
    snapshotID: str
    names: list[str]


class DrainOut(BaseModel):
    """``POST /node/drain`` (aenv's own): sandbox ids by what became of them."""

    moved: list[str]
    parked: list[str]
    failed: dict[str, str]


class GcOut(BaseModel):
    """``POST /repository/gc`` (aenv's own)."""

    deletedBlobs: int
    freedBytes: int
    keptReferenced: int
    keptRecent: int


class ErrorOut(BaseModel):
    code: int
    message: str
    #: Machine-readable, as the scheduler's: ``quota_exceeded`` for a team's quota (a
    #: gateway does not try that child on another node); else null.
    error: str | None = None


class ForkEntry(BaseModel):
    sandbox: SandboxOut | None = None
    error: ErrorOut | None = None
