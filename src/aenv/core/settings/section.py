"""What every section of the node's settings shares: the ``AENV_`` prefix, frozen values,
unknown keys refused, docstrings as the fields' descriptions, and the sources' order."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_CONFIG_FILE = Path("/etc/aenv/aenv.toml")


def config_sources(settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                   env_settings: PydanticBaseSettingsSource
                   ) -> tuple[PydanticBaseSettingsSource, ...]:
    """Arguments, then ``AENV_*``, then the ``AENV_CONFIG`` TOML file if it exists: the order
    every aenv role's settings read (node, gateway, scheduler)."""
    config_file = Path(os.environ.get("AENV_CONFIG", DEFAULT_CONFIG_FILE))
    sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
    if config_file.is_file():
        sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
    return tuple(sources)


class AenvSources(BaseSettings):
    """Settings read from :func:`config_sources` (every aenv role's: node, gateway,
    scheduler)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return config_sources(settings_cls, init_settings, env_settings)


class Section(AenvSources):
    """One section of the node's settings (its fields are documented in its class body; the
    class docstring's first line heads the section in ``docs/config.md``)."""

    # Each section sets it again: pydantic reads attribute docstrings of the class that
    # declares the field.
    model_config = SettingsConfigDict(
        env_prefix="AENV_", frozen=True, extra="forbid", use_attribute_docstrings=True
    )
