"""Images and builds: registries, the layer cache, and the bounds of an image and a build."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from aenv.core.settings.section import Section


class ImageSettings(Section):
    """Images and builds: registries, the layer cache, and the limits of an image and a build."""

    layers_dir: Path | None = None
    """Where template layers live. Unset: ``<home>/layers``. Several homes may share one."""

    insecure_registries: tuple[str, ...] = ()
    """Registries pulled from without TLS verification (``host`` or ``host:port``; plain HTTP if
    they do not speak HTTPS). Loopback registries (``localhost``, ``127.0.0.0/8``, ``::1``) are
    always treated so, as Docker does."""

    registry_auth_file: Path | None = None
    """Credentials for image pulls, in Docker's ``config.json`` format (``{"auths": {"host":
    {"auth": base64("user:password")}}}``). Credentials given with a build request win."""

    registry_cert_dir: Path | None = None
    """Directory of extra TLS files for registries: CA certificates (``*.crt``) and client
    certificate/key pairs (``*.cert``/``*.key``). Unset: the system's trust store."""

    local_image_roots: tuple[Path, ...] = ()
    """Directories from which ``oci:<dir>`` and ``docker-archive:<file>`` image sources may be
    imported (the node reads them as root, so API callers may name only these). Empty: local
    sources are refused; registry references are always allowed."""

    layer_cache_bytes: int = Field(default=100 << 30, ge=0)
    """Disk the layer cache may use for image layers and blobs, in bytes (0: unbounded). Above
    the high watermark, layers no running sandbox uses are evicted, least recently used first,
    down to the low watermark; an evicted layer is fetched again from its image's source when
    next needed. Layers made by template builds are never evicted."""

    layer_cache_high: float = Field(default=0.90, gt=0, le=1)
    """High watermark of the layer cache, as a fraction of ``layer_cache_bytes``."""

    layer_cache_low: float = Field(default=0.75, gt=0, le=1)
    """Low watermark of the layer cache (eviction stops there)."""

    max_layer_bytes: int = Field(default=20 << 30, gt=0)
    """Largest unpacked image layer (logical bytes; a sparse file counts its full size)."""

    max_image_bytes: int = Field(default=50 << 30, gt=0)
    """Largest unpacked image (all layers)."""

    build_step_timeout_s: float = Field(default=3600.0, gt=0)
    """How long one RUN step of a template build may take."""

    build_ready_timeout_s: float = Field(default=300.0, gt=0)
    """How long a template's ready command may take to succeed after its start command."""
