"""Which templates this node can start sandboxes from.

The built-in ``base`` template (Debian bookworm, see ``base.py``), every committed snapshot
in the repository (by id, or by name: the newest snapshot carrying it), and every template
built with the template-build API (by id or name, optionally ``name:tag``; no tag means
``default``, the newest ready build). Snapshots and built templates have memory images:
sandboxes made from them are restored, not booted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from aenv.core.errors import NotFound, Unavailable
from aenv.orchestrator import restore_match
from aenv.orchestrator.deps import Template
from aenv.storage.layers import LayerStore
from aenv.storage.repository import Materialized, Snapshot, SnapshotDraft, SnapshotRepository
from aenv.store.templates import DEFAULT_TAG, TemplateStore
from aenv.templates.base import ProgressCallback, build_base

BASE = "base"


class TemplateCatalog:
    def __init__(self, layers: LayerStore, repository: SnapshotRepository) -> None:
        self._layers = layers
        self._repository = repository
        self._base: Template | None = None
        #: Built templates (set once the node's database is open).
        self.built: TemplateStore | None = None
        #: This node's envd bundle (a snapshot made with the same bytes uses it).
        self.own_bundle: Path | None = None
        #: What this node's runtime offers a memory image (``restore_match``).
        self.host: dict[str, str] = {}
        #: Disk workspaces: where snapshots' disk images are kept (None: files in memory).
        self.disk_dir: Path | None = None

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
        # A snapshot answered here a moment ago restores from its staged image at once.
        pending = await self._repository.materialize_pending(name, self.disk_dir)
        if pending is not None and pending[0].kind == "snapshot":
            draft, local = pending
            restore_match.check(draft.snapshot_id, draft.requirements, self.host)
            return self._template(draft, local)
        snapshot = await self._repository.lookup(name, verify=True)
        if snapshot is not None and snapshot.manifest.kind == "snapshot":
            return await self.from_snapshot(snapshot)
        built = await self._resolve_built(name)
        if built is not None:
            return built
        raise NotFound(f"template '{name}' not found")

    async def _resolve_built(self, name: str) -> Template | None:
        if self.built is None:
            return None
        base, sep, tag = name.partition(":")
        record = await self.built.get_template(base)
        if record is None:
            return await self._built_elsewhere(base) if not sep or tag == DEFAULT_TAG else None
        build_id = await self.built.tagged_build(record.template_id, tag if sep else DEFAULT_TAG)
        if build_id is None:
            running = await self.built.builds(record.template_id, ["building"])
            if running:
                since = time.time() - running[0].created_at
                raise Unavailable(f"template '{name}' is being built (build "
                                  f"{running[0].build_id}, for {since:.0f} s); try again when "
                                  "it is ready")
            raise NotFound(f"template '{name}' has no ready build"
                           + (f" tagged '{tag}'" if sep else ""))
        build = await self.built.get_build(record.template_id, build_id)
        snapshot = (await self._repository.lookup(build.snapshot_id)
                    if build and build.snapshot_id else None)
        if snapshot is None:
            raise NotFound(f"template '{name}' has lost its memory image; build it again")
        return replace(await self.from_snapshot(snapshot), template_id=record.template_id,
                       alias=record.name, snapshot_id=None)

    async def _built_elsewhere(self, name: str) -> Template | None:
        """A template another node sharing the repository built: its newest memory image
        under that name or template id (tags live in the building node's database)."""
        await self._repository.refresh()
        images = [s for s in self._repository.list(kind="template")
                  if name in s.manifest.names or s.manifest.template_id == name]
        if not images:
            return None
        newest = images[0]
        return replace(await self.from_snapshot(newest), template_id=newest.manifest.template_id,
                       alias=name, snapshot_id=None)

    async def from_snapshot(self, snapshot: Snapshot) -> Template:
        """A template that restores ``snapshot``, with what it needs fetched to this node.

        On failure: :class:`FailedPrecondition` if this node cannot restore its memory image
        (another runtime build, platform or CPU); the repository's errors when fetching.
        """
        m = snapshot.manifest
        assert self.own_bundle is not None, "the catalog is used before the node set its bundle"
        if m.memory:
            restore_match.check(m.snapshot_id, m.requirements, self.host)
        local = await self._repository.materialize(snapshot, self.own_bundle, self.disk_dir)
        return self._template(m, local)

    @staticmethod
    def _template(m: SnapshotDraft, local: Materialized) -> Template:
        return Template(
            template_id=m.snapshot_id,
            alias=m.names[0] if m.names else None,
            layers=local.layers,
            cpu_count=m.cpu_count,
            memory_mb=m.memory_mb,
            default_user=m.default_user,
            default_workdir=m.default_workdir,
            image=local.image,
            envd_bundle=local.envd_bundle,
            envd_token=m.envd_token,
            env_vars=dict(m.env_vars),
            metadata=dict(m.metadata),
            snapshot_id=m.snapshot_id,
            disk_image=local.disk,
            volume_mounts=tuple(m.volume_mounts),
        )
