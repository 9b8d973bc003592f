"""Template builders: turn a recipe (built-in, OCI image, Dockerfile subset) into layers.

Builders write only through a :class:`aenv.storage.layers.LayerStore`; committing the result as
a template snapshot is the orchestrator's job.
"""

from aenv.templates.base import (
    BaseRecipe,
    BuildResult,
    ProgressCallback,
    base_recipe,
    build_base,
)
from aenv.templates.busybox import build_busybox, busybox_recipe

__all__ = [
    "BaseRecipe",
    "BuildResult",
    "ProgressCallback",
    "base_recipe",
    "build_base",
    "build_busybox",
    "busybox_recipe",
]
