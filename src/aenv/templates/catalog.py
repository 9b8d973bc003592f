"""Which templates this node can start sandboxes from.

The built-in ``base`` template (Debian bookworm, see ``base.py``) and every committed snapshot
in the repository (by id, or by name: the newest snapshot carrying it). A snapshot is a
template with a memory image: sandboxes made from it are restored, not booted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from aenv.core.errors import NotFound
from aenv.orchestrator.deps import Template
from aenv.storage.layers import LayerStore
from aenv.storage.repository import Snapshot, SnapshotRepository
from aenv.templates.base import ProgressCallback, build_base

BASE = "base"


class TemplateCatalog:
    def __init__(self, layers: LayerStore, repository: SnapshotRepository) -> None:
        self._layers = layers
        self._repository = repository
        self._base: Template | None = None

    async def prepare(self, on_progress: ProgressCallback | None = None) -> None:
        """Build (or find) the base template's layer; a no-op when it is already built."""
        result = await build_base(self._layers, on_progress=on_progress)
        self._base = Template(template_id=BASE, alias=BASE, layers=(Path(result.layer.path),))

    def use_image(self, template: Template) -> None:
        """From now on ``base`` is restored from ``template.image`` (see template_image.py)."""
        self._base = replace(template)

    async def resolve(self, name: str) -> Template:
        if name == BASE and self._base is not None:
            return self._base
        snapshot = self._repository.find(name)
        if snapshot is not None and snapshot.manifest.kind == "snapshot":
            return from_snapshot(snapshot)
        raise NotFound(f"template '{name}' not found")


def from_snapshot(snapshot: Snapshot) -> Template:
    m = snapshot.manifest
    return Template(
        template_id=m.snapshot_id,
        alias=m.names[0] if m.names else None,
        layers=tuple(Path(p) for p in m.layers),
        cpu_count=m.cpu_count,
        memory_mb=m.memory_mb,
        default_user=m.default_user,
        default_workdir=m.default_workdir,
        image=snapshot.memory_dir,
        envd_bundle=Path(m.envd_bundle),
        envd_token=m.envd_token,
        env_vars=dict(m.env_vars),
        metadata=dict(m.metadata),
        snapshot_id=m.snapshot_id,
    )
