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

    host_tasks_limit: int = Field(default=8192, ge=256)
    """Host tasks (threads) one sandbox's runtime may have: its host cgroup's ``pids.max``,
    the host's backstop. Reaching it ends the sandbox (the sentry cannot start a thread).
    On the ptrace platform the runtime keeps ~13 host tasks per guest process the sandbox
    has run at once (traced stub threads, kept for reuse), so this allows ~600 concurrent
    processes; 2,048 (the earlier value) ended a sandbox running 200 ``sleep``s."""

    runaway_tasks: int = Field(default=2048, ge=0)
    """At this many host tasks (of ``host_tasks_limit``), the node kills every process in the
    sandbox but envd — a fork bomb, or a workload growing past what the host allows — and
    the sandbox lives on (``orchestrator/task_guard.py``; ~150 concurrent processes on
    ptrace). The kill itself adds ~3 host tasks per process killed, so keep it well below
    the limit. Again only after the sandbox grew by ``task_guard.REGROWTH`` more (the
    runtime keeps the tasks of the first). 0: off (a bomb ends its sandbox)."""

    max_fork_count: int = Field(default=100, ge=1, le=1000)
    """Most children one fork request may ask for."""

    idempotency_ttl_s: float = Field(default=3600.0, gt=0)
    """How long a create's ``Idempotency-Key`` is remembered: a repeat with the same key (and
    API key) within this time gets the first create's answer instead of a second sandbox. In
    memory only: a restarted node has forgotten every key (``api/idempotency.py``)."""
