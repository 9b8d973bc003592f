"""Persistent volumes: sizes, idle release, and their tokens' lifetime."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class VolumeSettings(Section):
    """Volumes: persistent disks that outlive sandboxes."""

    volume_default_size_mb: int = Field(default=1024, ge=16)
    """A new volume's size (its quota: a write past it fails with ENOSPC, the content API
    answers 507) when the create request does not say (aenv's ``sizeMB``)."""

    volume_max_size_mb: int = Field(default=100 * 1024, ge=16)
    """The largest volume a create may ask for. Images are sparse: a volume takes host disk
    for what is written in it, not for its size."""

    volume_idle_release_s: float = Field(default=30.0, ge=0)
    """A volume no sandbox of this node mounts and no content request used for this long is
    committed to the repository and released, so another node can take it."""

    volume_token_ttl_s: int = Field(default=3600, ge=60)
    """How long a volume token (``POST /volumes``, ``GET /volumes/{id}``) lets the content API
    be used; the SDKs keep the token of a ``Volume`` object and never refresh it."""
