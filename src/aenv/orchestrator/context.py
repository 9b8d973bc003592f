"""The small context every orchestrator operation runs over."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aenv.core.settings import Settings
from aenv.orchestrator.activity import Activity
from aenv.orchestrator.admission import Admission
from aenv.orchestrator.deps import (
    GuestConnector,
    RootfsManager,
    SlotPool,
    Template,
    TemplateCatalog,
)
from aenv.orchestrator.liveness import Liveness
from aenv.orchestrator.owners import Owners
from aenv.runtime.base import Runtime
from aenv.storage.images import ImageStore
from aenv.storage.layers import LayerStore
from aenv.storage.repository import SnapshotRepository
from aenv.storage.workspaces import WorkspaceStore
from aenv.store.sqlite import Store
from aenv.store.templates import TemplateStore

if TYPE_CHECKING:
    from aenv.orchestrator.builder import Builder
    from aenv.orchestrator.ops.boot import Booted
    from aenv.orchestrator.precreated import PrecreatedPool


class WarmSource(Protocol):
    def take(self, template: Template) -> Booted | None: ...

    @property
    def ready(self) -> int:
        """Sandboxes waiting to be taken now."""


class SpillScheduler(Protocol):
    def schedule(self, sandbox_id: str, *, delay: float | None = None) -> None:
        """Write the frozen sandbox to disk after ``delay`` s (None: ``pause_hot_s``)."""

    def cancel(self, sandbox_id: str) -> None: ...


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
class Node:
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
    streams: StreamRegistry = field(default_factory=StreamRegistry)
    #: One owner per sandbox: its operations take turns, and a kill wins (``owners.py``).
    owners: Owners = field(default_factory=Owners)
    #: Bounds the creates starting sandboxes at once and waiting (``admission.py``).
    admission: Admission = field(default_factory=Admission.unlimited)
    #: Last traffic per sandbox (proxy and API), for the idle auto-pause.
    activity: Activity = field(default_factory=Activity)
    #: Booted sandboxes of the default template waiting to be claimed (None: no pool).
    warm: WarmSource | None = None
    #: Sandboxes created ahead (not started) for restores of one shape (None: no pool).
    precreated: PrecreatedPool | None = None
    #: Writes frozen (hot-paused) sandboxes to disk in the background (None: at once, inline).
    spiller: SpillScheduler | None = None
    clock: Callable[[], float] = time.time
    #: Template layers (built steps, unpacked image layers).
    layers: LayerStore | None = None
    #: Pulled OCI images (None: this node serves no images).
    images: ImageStore | None = None
    #: Templates made by the template-build API and their builds.
    template_store: TemplateStore | None = None
    #: Uploaded build files (``<dir>/files/<filesHash>``) and build scratch space.
    build_dir: Path | None = None
    #: Runs template builds (``orchestrator/builder.py``; None: this node builds none).
    builder: Builder | None = None
    #: What this node offers a memory image (``restore_match.host_requirements``): recorded
    #: in every manifest with one, checked before every restore of another node's image.
    host_requirements: dict[str, str] = field(default_factory=dict)
    #: Disk workspaces (``workspace = "disk"``): the sandboxes' disk images; None otherwise.
    workspaces: WorkspaceStore | None = None
    #: Set by a drain (``ops/drain.py``): the node's heartbeats say ``draining``, so the
    #: cluster places nothing more here.
    draining: bool = False
    #: Sandboxes whose envd does not answer (``liveness.py``): shown in info, and the proxy
    #: fails their envd requests at once.
    liveness: Liveness = field(default_factory=Liveness)
