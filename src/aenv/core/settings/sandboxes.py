"""What a sandbox gets when its create does not say, and how many creates the node admits."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class SandboxSettings(Section):
    """Sandboxes: what a create gets when it does not say, and how many the node admits."""

    default_template: str = "base"
    """Template used when a create request names none."""

    default_timeout_s: int = Field(default=300, ge=1)
    """Sandbox lifetime when the create request gives no ``timeout``."""

    max_timeout_s: int = Field(default=86_400, ge=1)
    """Longest lifetime a client may ask for (create, set_timeout, connect)."""

    default_cpu_count: int = Field(default=2, ge=1)
    """vCPUs of a sandbox (templates may override)."""

    default_memory_mb: int = Field(default=1024, ge=64)
    """Memory limit of a sandbox in MiB (templates may override)."""

    disk_size_mb: int = Field(default=10_240, ge=64)
    """Disk size reported for a sandbox's writable layer, MiB."""

    max_sandboxes: int = Field(default=200, ge=1)
    """Running sandboxes this node accepts before answering 429."""

    max_concurrent_starts: int = Field(default=4, ge=1)
    """Creates starting a sandbox (a restore, or a boot) at once; more wait in line. A restore
    costs ~0.3 s of CPU: four keep two cores busy through each other's waits for envd, where
    a hundred at once would make every one of them take tens of seconds."""

    max_queued_starts: int = Field(default=32, ge=0)
    """Creates waiting for a start; one more is answered 429 at once, with ``Retry-After``.
    Thirty-two behind four starts wait a few seconds, well inside the SDKs' 60 s timeout."""

    busy_retry_after_s: int = Field(default=1, ge=1)
    """``Retry-After`` (seconds) of a create's 429 (the node at its start or sandbox limit). The
    E2B SDKs retry a 429 up to three times after that long, so keep it short."""

    max_fork_count: int = Field(default=100, ge=1, le=1000)
    """Most children one fork request may ask for."""

    idempotency_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a create's ``Idempotency-Key`` is remembered: a repeat with the same key (and
    API key) within this time gets the first create's answer instead of a second sandbox. In
    memory only: a restarted node has forgotten every key (``api/idempotency.py``)."""
