"""Node configuration: one frozen object, read once in ``main()`` and passed down.

Sources, later wins: defaults < TOML file (``AENV_CONFIG``, default ``/etc/aenv/aenv.toml`` if it
exists) < ``AENV_*`` environment variables. The fields are kept in sections, one module each
(the node, sandboxes, the lifecycle, pools, storage, volumes, images, network, requests,
observability); :class:`Settings` is all of them in one flat object, so a setting is read as
``settings.<name>`` wherever it is used. Every field is documented; ``docs/config.md`` is
generated from these docstrings (``python -m aenv.core.settings``). ``os.environ`` is read
nowhere else in aenv.
"""

from __future__ import annotations

from typing import Any

from aenv.core.settings.images import ImageSettings
from aenv.core.settings.lifecycle import LifecycleSettings
from aenv.core.settings.network import NetworkSettings
from aenv.core.settings.node import NodeSettings
from aenv.core.settings.observe import ObserveSettings
from aenv.core.settings.pools import PoolSettings
from aenv.core.settings.requests import RequestLimits
from aenv.core.settings.sandboxes import SandboxSettings
from aenv.core.settings.section import (
    DEFAULT_CONFIG_FILE,
    AenvSources,
    Section,
    config_sources,
)
from aenv.core.settings.storage import StorageSettings
from aenv.core.settings.volumes import VolumeSettings

__all__ = ["DEFAULT_CONFIG_FILE", "SECTIONS", "AenvSources", "Settings", "config_sources", "load",
           "reference_markdown"]

#: The sections in the order ``docs/config.md`` lists them.
SECTIONS: tuple[type[Section], ...] = (
    NodeSettings, SandboxSettings, LifecycleSettings, PoolSettings, StorageSettings,
    VolumeSettings, ImageSettings, NetworkSettings, RequestLimits, ObserveSettings,
)


class Settings(ObserveSettings, RequestLimits, NetworkSettings, ImageSettings, VolumeSettings,
               StorageSettings, PoolSettings, LifecycleSettings, SandboxSettings, NodeSettings):
    """Every section's settings (``docs/config.md``)."""

    def repository_location(self) -> str:
        """The repository setting, with its default filled in."""
        return self.repository or str(self.home / "repository")


def load(**overrides: Any) -> Settings:
    return Settings(**overrides)


def reference_markdown() -> str:
    """The configuration reference, generated from the field docstrings."""
    from aenv.core.settings.reference import markdown

    return markdown(SECTIONS)
