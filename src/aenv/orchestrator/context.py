"""The small context every orchestrator operation runs over."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aenv.core.settings import Settings
from aenv.orchestrator.activity import Activity
from aenv.orchestrator.admission import Admission
from aenv.orchestrator.audit import AuditTrail
from aenv.orchestrator.deps import (
    GuestConnector,
    RootfsManager,
    SlotPool,
    TemplateCatalog,
)
from aenv.orchestrator.liveness import Liveness
from aenv.orchestrator.owners import Owners
from aenv.orchestrator.sandbox_logs import LogBook
from aenv.orchestrator.secrets import Vault
from aenv.orchestrator.supervisor import Supervisor
from aenv.orchestrator.team_metrics import TeamMeter
from aenv.orchestrator.team_quota import QuotaGate
from aenv.orchestrator.tenancy import Tenancy
from aenv.orchestrator.volumes import Volumes
from aenv.orchestrator.webhooks import Webhooks
from aenv.orchestrator.workload_identity import Issuer
from aenv.runtime.base import Runtime
from aenv.storage.images import ImageStore
from aenv.storage.layers import LayerStore
from aenv.storage.repository import SnapshotRepository
from aenv.storage.workspaces import WorkspaceStore
from aenv.store.sqlite import Store
from aenv.store.templates import TemplateStore

if TYPE_CHECKING:
    from aenv.orchestrator.builder import Builder
    from aenv.orchestrator.precreated import PrecreatedPool
    from aenv.orchestrator.resume_ready import ResumeReady
    from aenv.orchestrator.spill import Spiller
    from aenv.orchestrator.warm import WarmPool


class StreamRegistry:
    """Proxied connections per sandbox, so killing a sandbox aborts its open streams."""

    def __init__(self) -> None:
        self._tasks: dict[str, set[asyncio.Task[object]]] = {}
        #: Tasks cancelled by ``abort`` (not by a server shutdown), until they notice.
        self._aborted: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()

    def add(self, sandbox_id: str, task: asyncio.Task[object]) -> None:
        self._tasks.setdefault(sandbox_id, set()).add(task)

    def discard(self, sandbox_id: str, task: asyncio.Task[object]) -> None:
        tasks = self._tasks.get(sandbox_id)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._tasks[sandbox_id]

    def abort(self, sandbox_id: str) -> int:
        tasks = self._tasks.pop(sandbox_id, set())
        for task in tasks:
            self._aborted.add(task)
            task.cancel()
        return len(tasks)

    def was_aborted(self, task: asyncio.Task[object]) -> bool:
        """True once for a task ``abort`` cancelled; the caller then un-cancels it."""
        if task in self._aborted:
            self._aborted.discard(task)
            return True
        return False

    def count(self, sandbox_id: str) -> int:
        return len(self._tasks.get(sandbox_id, ()))


@dataclass
class DrainFlag:
    """Set by a drain (``ops/drain.py``): the node's heartbeats say ``draining``, so the
    cluster places nothing more here. The one mutable part of the node's context."""

    on: bool = False


@dataclass(frozen=True)
class Node:
    """Everything an operation runs over, assembled once by the composition root
    (``server.py``) and never changed after: every service is present — a feature that is
    off is its empty form (a pool of size 0, a spiller nothing is scheduled on) — so no
    operation asks whether one exists. The exception is ``workspaces``: ``None`` *is* the
    memory workspace mode (written files live in sandbox memory), not a missing service."""

    settings: Settings
    store: Store
    runtime: Runtime
    pool: SlotPool
    rootfs: RootfsManager
    templates: TemplateCatalog
    guests: GuestConnector
    envd_bundle: Path
    #: Committed snapshots (and template images): ``storage.repository.SnapshotRepository``.
    repository: SnapshotRepository
    #: Memory images of sandboxes paused to disk, ``<paused_dir>/<sandbox_id>``.
    paused_dir: Path
    #: Template layers (built steps, unpacked image layers).
    layers: LayerStore
    #: Pulled OCI images.
    images: ImageStore
    #: Templates made by the template-build API and their builds.
    template_store: TemplateStore
    #: Uploaded build files (``<dir>/files/<filesHash>``) and build scratch space.
    build_dir: Path
    #: Runs template builds (``orchestrator/builder.py``).
    builder: Builder
    #: Booted sandboxes of the default template waiting to be claimed (size 0: none).
    warm: WarmPool
    #: Sandboxes created ahead (not started) for restores of one shape (size 0: none).
    precreated: PrecreatedPool
    #: Sandboxes paused to disk with a runtime sandbox made ahead on their files, so their
    #: resume restores into it (disk workspaces; size 0: none).
    resume_ready: ResumeReady
    #: Writes frozen (hot-paused) sandboxes to disk in the background.
    spiller: Spiller
    #: What this node offers a memory image (``restore_match.host_requirements``): recorded
    #: in every manifest with one, checked before every restore of another node's image.
    host_requirements: dict[str, str]
    #: Disk workspaces (``workspace = "disk"``): the sandboxes' disk images; None: the
    #: memory workspace mode.
    workspaces: WorkspaceStore | None
    volumes: Volumes
    #: Who did what to which object (``audit.py``).
    audit: AuditTrail
    #: Teams, their keys, and who owns what (``tenancy.py``).
    tenancy: Tenancy
    #: The teams' secrets, sealed (``secrets.py``).
    secrets: Vault
    #: Mints the workload identity tokens egress rules name (``workload_identity.py``).
    identity: Issuer
    #: Each sandbox's logs: lifecycle events and its console (``sandbox_logs.py``).
    logbook: LogBook
    #: Each team's sandboxes up and starts over time (``team_metrics.py``).
    team_meter: TeamMeter
    #: The teams' lifecycle webhooks and their outbox (``webhooks.py``).
    webhooks: Webhooks
    #: Owns every background loop (``supervisor.py``).
    supervisor: Supervisor = field(default_factory=Supervisor)
    streams: StreamRegistry = field(default_factory=StreamRegistry)
    #: One owner per sandbox: its operations take turns, and a kill wins (``owners.py``).
    owners: Owners = field(default_factory=Owners)
    #: Bounds the creates starting sandboxes at once and waiting (``admission.py``).
    admission: Admission = field(default_factory=Admission.unlimited)
    #: The teams' quotas, held while sandboxes start (``team_quota.py``).
    quotas: QuotaGate = field(default_factory=QuotaGate)
    #: Last traffic per sandbox (proxy and API), for the idle auto-pause.
    activity: Activity = field(default_factory=Activity)
    #: Sandboxes whose envd does not answer (``liveness.py``): shown in info, and the proxy
    #: fails their envd requests at once.
    liveness: Liveness = field(default_factory=Liveness)
    drain: DrainFlag = field(default_factory=DrainFlag)
    clock: Callable[[], float] = time.time
