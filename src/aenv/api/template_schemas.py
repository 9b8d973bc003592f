"""Wire models of the template-build API (e2b-compat §2.4.10, the SDK's ``e2b/api/client/
models/template*.py``) and of ``POST /sandboxes-cold`` (AgentENV's route)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aenv.api.schemas import TimeoutSeconds


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class TemplateBuildRequestV3(_In):
    """``POST /v3/templates``."""

    name: str = Field(min_length=1, max_length=128)
    tags: list[str] | None = None
    cpu_count: int | None = Field(default=None, alias="cpuCount", ge=1, le=64)
    memory_mb: int | None = Field(default=None, alias="memoryMB", ge=128, le=262_144)
    min_free_disk_mb: int | None = Field(default=None, alias="minFreeDiskMb", ge=0)


class TemplateRequestResponseV3(BaseModel):
    templateID: str
    buildID: str
    public: bool
    names: list[str]
    tags: list[str]
    aliases: list[str]


class TemplateStep(_In):
    type: str
    args: list[str] = Field(default_factory=list)
    force: bool | None = None
    files_hash: str | None = Field(default=None, alias="filesHash")
    force_upload: bool | None = Field(default=None, alias="forceUpload")


class RegistryConfig(_In):
    type: str = "registry"
    username: str | None = None
    password: str | None = None


class TemplateBuildStartV2(_In):
    """``POST /v2/templates/{id}/builds/{buildID}``: E2B's body, plus aenv's Dockerfile form
    (``dockerfile`` + ``contextHash``, from ``aenv template build``)."""

    from_image: str | None = Field(default=None, alias="fromImage")
    from_template: str | None = Field(default=None, alias="fromTemplate")
    from_image_registry: RegistryConfig | None = Field(default=None, alias="fromImageRegistry")
    force: bool = False
    steps: list[TemplateStep] = Field(default_factory=list)
    start_cmd: str | None = Field(default=None, alias="startCmd")
    ready_cmd: str | None = Field(default=None, alias="readyCmd")
    dockerfile: str | None = Field(default=None, max_length=1_000_000)
    context_hash: str | None = Field(default=None, alias="contextHash")
    build_args: dict[str, str] = Field(default_factory=dict, alias="buildArgs")
    target: str | None = None


class TemplateBuildFileUpload(BaseModel):
    present: bool
    url: str | None = None
    headers: dict[str, str] | None = None


class BuildLogEntry(BaseModel):
    timestamp: str
    level: str
    message: str
    step: str | None = None


class BuildStatusReason(BaseModel):
    message: str
    step: str | None = None
    logEntries: list[BuildLogEntry] | None = None


class TemplateBuildInfo(BaseModel):
    templateID: str
    buildID: str
    status: str
    logs: list[str]
    logEntries: list[BuildLogEntry]
    reason: BuildStatusReason | None = None


class TemplateOut(BaseModel):
    """E2B's ``Template`` (``GET /templates``)."""

    templateID: str
    buildID: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    public: bool
    aliases: list[str]
    names: list[str]
    createdAt: str
    updatedAt: str
    createdBy: None = None
    lastSpawnedAt: str | None
    spawnCount: int
    buildCount: int
    envdVersion: str
    buildStatus: str


class TemplateAliasResponse(BaseModel):
    templateID: str
    public: bool


class AssignTags(_In):
    target: str = Field(min_length=1)
    tags: list[str] = Field(min_length=1)


class AssignedTags(BaseModel):
    buildID: str
    tags: list[str]


class DeleteTags(_In):
    name: str = Field(min_length=1)
    tags: list[str] = Field(min_length=1)


class TemplateTagOut(BaseModel):
    tag: str
    buildID: str
    createdAt: str


class ColdSandbox(_In):
    """``POST /sandboxes-cold``: a sandbox booted straight from an OCI image."""

    image: str = Field(min_length=1, max_length=1024)
    cpu_count: int | None = Field(default=None, alias="cpuCount", ge=1, le=64)
    memory_mb: int | None = Field(default=None, alias="memoryMB", ge=128, le=262_144)
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    start_cmd: str | None = Field(default=None, alias="startCmd")
    metadata: dict[str, str] | None = None
    timeout: TimeoutSeconds | None = None
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    registry: RegistryConfig | None = Field(default=None, alias="fromImageRegistry")
