"""Sandboxes' disks (workspaces) and the repository (a directory or S3), with its cache and GC."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr

from aenv.core.settings.section import Section


class StorageSettings(Section):
    """Storage: sandboxes' disks, the repository of snapshots, templates and paused sandboxes."""

    workspace: Literal["memory", "disk"] = "disk"
    """Where a sandbox's written files live. ``disk``: in a disk image of its own of
    ``disk_size_mb`` (writes past it fail with ENOSPC), on a reflink-capable pool under
    ``<home>/workspaces`` (needs loop devices, ``mkfs.xfs`` and ``mkfs.ext4``); ``/tmp`` stays
    in memory. ``memory``: inside the sandbox's memory (part of every memory image; bounded by
    its memory limit); for hosts without loop devices (docs/workspaces.md)."""

    workspace_pool_bytes: int = Field(default=0, ge=0)
    """Size of the workspace pool image made when ``<home>/workspaces`` cannot reflink
    (0: 80% of the free space of the home's filesystem, at most 1 TiB)."""

    workspace_overcommit: float | None = Field(default=None, ge=1.0)
    """How many times the pool's size the disks of its sandboxes may add up to (their
    ``disk_size_mb`` each). Unset: no bound on that sum (images are sparse and hold only what
    was written); creates, forks and snapshots are refused while less than a twentieth of the
    pool is really free. 1: a full pool is impossible, at one full disk per sandbox. Between,
    and unset, sandboxes that all fill their disks at once can fill the pool, and their next
    writes fail with I/O errors (docs/workspaces.md)."""

    host_disk_watermark_percent: float = Field(default=90.0, gt=0, le=100)
    """Disk workspaces: above this usage (``df``'s ``Use%``) of the host file system holding
    the workspace pool (the home's, for a pool image), creates, resumes, forks, snapshots and
    disk growths are refused with 429 and ``Retry-After``, so the sandboxes already running
    keep the rest to write into. 100: never refused (docs/workspaces.md)."""

    workspace_trim_interval_s: float = Field(default=5.0, ge=0)
    """Disk workspaces on a pool image: how often the image is checked for blocks freed in the
    pool (deleted files and images) that the host has not got back yet, and trimmed if so.
    0: trimmed only after a kill or pause; XFS then returns the rest within ~30 s by itself."""

    repository: str | None = None
    """Where snapshots, templates and paused sandboxes are kept, shared by every node that
    names the same place: a directory (``posix_fs``; local or a shared mount) or
    ``s3://BUCKET/PREFIX`` (any S3-compatible store; endpoint, region and credentials below).
    Unset: ``<home>/repository``."""

    s3_endpoint: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_endpoint", "AENV_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    """S3 endpoint URL (e.g. ``http://minio:9000``); also read from ``AWS_ENDPOINT_URL``.
    Unset: AWS."""

    s3_region: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_region", "AENV_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"))
    """S3 region; also read from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``."""

    s3_access_key_id: str | None = Field(default=None, validation_alias=AliasChoices(
        "s3_access_key_id", "AENV_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"))
    """S3 access key; also read from ``AWS_ACCESS_KEY_ID``."""

    s3_secret_access_key: SecretStr | None = Field(default=None, validation_alias=AliasChoices(
        "s3_secret_access_key", "AENV_S3_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"))
    """S3 secret key; also read from ``AWS_SECRET_ACCESS_KEY``."""

    s3_allow_http: bool = Field(default=False, validation_alias=AliasChoices(
        "s3_allow_http", "AENV_S3_ALLOW_HTTP", "AWS_ALLOW_HTTP"))
    """Allow a plain-HTTP S3 endpoint; also read from ``AWS_ALLOW_HTTP``."""

    s3_virtual_hosted: bool = Field(default=False, validation_alias=AliasChoices(
        "s3_virtual_hosted", "AENV_S3_VIRTUAL_HOSTED", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"))
    """Virtual-hosted addressing (``BUCKET.endpoint``) instead of path style."""

    repository_cache_bytes: int = Field(default=50 << 30, ge=0)
    """Disk this node may use for its copies of repository blobs (memory images, layer and
    bundle tarballs), in bytes (0: unbounded); least recently used ones are dropped beyond it
    and fetched again when needed."""

    gc_interval_s: float = Field(default=3600.0, ge=0)
    """How often this node collects the repository's garbage (blobs no committed snapshot,
    template or paused sandbox names). 0: never (another node does it)."""

    gc_grace_s: float = Field(default=3600.0, ge=0)
    """A blob without a manifest is kept this long: a commit in flight on any node writes its
    blobs before its manifest. Longer than the slowest commit."""

    def s3_options(self) -> dict[str, Any]:
        """The S3 connection options, as ``storage.objects.S3Location`` takes them."""
        secret = self.s3_secret_access_key
        return {
            "endpoint": self.s3_endpoint, "region": self.s3_region,
            "access_key_id": self.s3_access_key_id,
            "secret_access_key": secret.get_secret_value() if secret else None,
            "allow_http": self.s3_allow_http, "virtual_hosted": self.s3_virtual_hosted,
        }
