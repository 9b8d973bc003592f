"""What a committed snapshot is, on the wire: its manifest, naming blobs by content digest.

A manifest says nothing about where it was made: no host paths, only digests (layers, the
memory image, the envd bundle) and what a node needs to restore the memory image (the
requirements it must match). Strict (unknown fields are an error, so a newer writer's manifest
is never half-understood) and frozen (a committed snapshot never changes).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from aenv.core.errors import InvalidArgument

#: The manifest format this code writes and the newest it reads. Format 1 (host paths, one
#: directory per snapshot) is no longer read: see docs/repository.md.
MANIFEST_FORMAT = 2

#: The files of a complete runsc memory image. Mirrors ``aenv.runtime.base.IMAGE_FILES``: storage
#: must not import the runtime (the layering contract), so keep the two in step by hand.
IMAGE_FILES = ("checkpoint.img", "pages_meta.img", "pages.img")

# Ids become keys and path components: a short, portable set of characters, never "." or "..".
_SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")

Kind = Literal["snapshot", "template", "paused"]


def is_snapshot_id(snapshot_id: str) -> bool:
    """Whether ``snapshot_id`` is well formed: 1-64 of ``[A-Za-z0-9._-]``, not starting with "."."""
    return isinstance(snapshot_id, str) and _SNAPSHOT_ID.fullmatch(snapshot_id) is not None


def check_snapshot_id(snapshot_id: str) -> str:
    """Return ``snapshot_id`` if it is well formed, else raise :class:`InvalidArgument`."""
    if not is_snapshot_id(snapshot_id):
        raise InvalidArgument(
            f"invalid snapshot id {snapshot_id!r} "
            "(want 1-64 characters of A-Z a-z 0-9 . _ -, not starting with '.')"
        )
    return snapshot_id


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Blob(_Frozen):
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)


class LayerBlob(Blob):
    #: The layer's id in a node's layer store (its recipe or content digest): a node that has
    #: the layer under this id does not fetch it.
    layer_id: str = Field(pattern=r"^[0-9a-f]{64}$")


class MemoryFile(Blob):
    name: Literal["checkpoint.img", "pages_meta.img", "pages.img"]


class DiskChunk(Blob):
    #: Position in the image, in units of ``chunk_bytes``.
    index: int = Field(ge=0)


class DiskImage(_Frozen):
    """A disk workspace's image (``storage/disk_chunks.py``): its data chunks; holes are
    absent."""

    size: int = Field(ge=0)
    chunk_bytes: int = Field(gt=0)
    chunks: list[DiskChunk]


class SnapshotDraft(_Frozen):
    """A manifest without its blobs: what the orchestrator knows before the commit."""

    snapshot_id: str
    #: User-given names (E2B ``name``); several snapshots may share one, the newest wins lookups.
    names: list[str] = Field(default_factory=list)
    #: ``template``: a template's memory image; ``paused``: a paused sandbox's state (its
    #: ``sandbox`` record says which); ``snapshot``: a user's snapshot.
    kind: Kind = "snapshot"
    #: The sandbox the snapshot was taken of (``None`` if it no longer matters, e.g. templates).
    source_sandbox_id: str | None = None
    #: The template the source sandbox was created from.
    template_id: str
    #: Unix seconds (wall clock: shown to people, compared across nodes).
    created_at: float
    #: What the restoring host must match (runtime, runsc build, platform, CPU features).
    requirements: dict[str, str] = Field(default_factory=dict)
    cpu_count: int
    memory_mb: int
    default_user: str = "user"
    #: The template's WORKDIR; None: none (each user's home).
    default_workdir: str | None = None
    env_vars: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    #: The envd access token baked into the memory image (the source sandbox's): a resume must
    #: present it to rotate envd to the new sandbox's token. A secret, like the image itself;
    #: kept out of ``repr`` so logs omit it.
    envd_token: str | None = Field(default=None, repr=False)
    #: For ``paused``: the sandbox's record fields a resume on another node needs (id, access
    #: token, timeout, metadata …), as the orchestrator wrote them.
    sandbox: dict[str, object] | None = Field(default=None, repr=False)
    #: The source sandbox's volumes (``[{"name", "path", "volume_id", "read_only"}]``): its
    #: memory image has them mounted, so a sandbox made from it mounts them again (read-only).
    volume_mounts: list[dict[str, object]] = Field(default_factory=list)
    #: The team that owns it (a snapshot: its source sandbox's; None: the default team's).
    team_id: str | None = None


class SnapshotManifest(SnapshotDraft):
    """``manifests/<id>.json``: everything needed to start a sandbox from a snapshot."""

    format: int = MANIFEST_FORMAT
    #: The read-only rootfs lowers, lowest first.
    layers: list[LayerBlob]
    #: The runsc memory image; empty for a filesystem-only snapshot (booted, not restored).
    memory: list[MemoryFile] = Field(default_factory=list)
    #: The envd bundle the memory image was made with (it must match byte for byte on resume).
    envd_bundle: Blob
    #: Disk workspaces: the sandbox's disk at the checkpoint instant (None: files in memory).
    disk: DiskImage | None = None

    @property
    def memory_size_bytes(self) -> int:
        return sum(f.size for f in self.memory)

    def digests(self) -> set[str]:
        """Every blob this manifest names (what GC must keep)."""
        found = {layer.digest for layer in self.layers}
        found.update(f.digest for f in self.memory)
        found.add(self.envd_bundle.digest)
        if self.disk is not None:
            found.update(c.digest for c in self.disk.chunks)
        return found
