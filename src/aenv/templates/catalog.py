"""Which templates this node can start sandboxes from.

For now the catalog holds the built-in ``base`` template (Debian bookworm, see ``base.py``);
snapshots and built templates join it with the snapshot repository.
"""

from __future__ import annotations

from pathlib import Path

from aenv.core.errors import NotFound
from aenv.orchestrator.deps import Template
from aenv.storage.layers import LayerStore
from aenv.templates.base import ProgressCallback, build_base

BASE = "base"


class TemplateCatalog:
    def __init__(self, layers: LayerStore) -> None:
        self._layers = layers
        self._base: Template | None = None

    async def prepare(self, on_progress: ProgressCallback | None = None) -> None:
        """Build (or find) the base template's layer; a no-op when it is already built."""
        result = await build_base(self._layers, on_progress=on_progress)
        self._base = Template(template_id=BASE, alias=BASE, layers=(Path(result.layer.path),))

    async def resolve(self, name: str) -> Template:
        if name == BASE and self._base is not None:
            return self._base
        raise NotFound(f"template '{name}' not found")
