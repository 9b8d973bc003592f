"""What the orchestrator needs from storage, network and templates, as small protocols.

The concrete classes live in their packages; these protocols keep the orchestrator testable
against honest fakes and keep imports pointing one way.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from aenv.core.net import EgressPolicy, NetSlot
from aenv.network.guest_pool import PooledConnection


@dataclass(frozen=True)
class Template:
    template_id: str
    alias: str | None
    #: Read-only layers, lowest first.
    layers: tuple[Path, ...]
    cpu_count: int | None = None
    memory_mb: int | None = None
    default_user: str = "user"
    #: The template's WORKDIR: commands' default cwd (and the path ``""``). None: none set,
    #: so each user's home, as in E2B (``/root`` for root).
    default_workdir: str | None = None
    #: A memory image (a runtime checkpoint directory): sandboxes of this template are *restored*
    #: from it instead of booted. None: cold boot from the layers.
    image: Path | None = None
    #: The envd bundle the image was made with (a restore must mount the same one).
    envd_bundle: Path | None = None
    #: The access token the image's envd already holds (None: never initialised), needed to
    #: hand a restored sandbox its own token.
    envd_token: str | None = None
    #: Environment variables the image's envd already has (kept unless overridden).
    env_vars: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    #: Set for snapshots: the snapshot id (templates built in: None).
    snapshot_id: str | None = None
    #: Disk workspaces: an image file on the workspace pool each sandbox's disk starts as a
    #: clone of (a fork's parent at the checkpoint instant). None: an empty disk.
    disk_image: Path | None = None
    #: A snapshot's volumes as its source had them mounted (JSON, ``orchestrator/volumes.py``'s
    #: ``Mounted``): its memory image needs them at the same paths.
    volume_mounts: tuple[dict[str, object], ...] = ()


class TemplateCatalog(Protocol):
    async def resolve(self, name: str) -> Template:
        """The template called ``name`` (id or alias); ``NotFound`` if there is none."""
        ...


class SlotPool(Protocol):
    async def acquire(self, policy: EgressPolicy | None = None) -> NetSlot: ...

    async def release(self, slot: NetSlot) -> None: ...

    async def adopt(self, slot: NetSlot, policy: EgressPolicy | None = None) -> None:
        """Mark an existing slot (found on restart) as in use."""
        ...

    async def set_egress(self, slot: NetSlot, policy: EgressPolicy) -> None: ...

    @property
    def ready_count(self) -> int:
        """Slots made ahead and not yet given out."""
        ...

    def egress_ca(self) -> str | None:
        """The CA (PEM) that ends the TLS of hosts with header rules; None: none does."""
        ...


class RootfsManager(Protocol):
    async def assemble(self, sandbox_id: str, lowers: Sequence[Path], *,
                       seed: Path | None = None) -> Path: ...

    def upper(self, sandbox_id: str) -> Path:
        """The host directory collecting the sandbox's writes (its overlay upper)."""
        ...

    async def disassemble(self, sandbox_id: str, *, keep_upper: bool,
                          lazy: bool = False) -> None: ...

    def sandbox_ids(self) -> list[str]:
        """Every sandbox that has a root filesystem (mounted or not) on this node."""
        ...

    def recorded_lowers(self, sandbox_id: str) -> list[Path] | None:
        """The read-only layers the sandbox's rootfs was assembled from (lowest first)."""
        ...

    async def ensure_mounted(self, sandbox_id: str) -> Path:
        """Re-mount a sandbox's rootfs (same lowers as recorded at assemble) if it is not."""
        ...

    async def adopt(self, sandbox_id: str, donor_id: str) -> Path:
        """Make the mounted rootfs of ``donor_id`` (same lowers) ``sandbox_id``'s, with all
        of the donor's directory; ``Conflict`` (nothing changed) when it cannot."""
        ...


class GuestConnector(Protocol):
    def transport(self, slot: NetSlot) -> httpx.AsyncBaseTransport:
        """An httpx transport whose connections reach the guest behind ``slot`` (cached)."""
        ...

    async def open_socket(self, slot: NetSlot, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to ``guest:port`` behind ``slot``."""
        ...

    async def acquire(self, slot: NetSlot, port: int) -> PooledConnection:
        """A keep-alive connection to ``guest:port`` (the proxy's HTTP relay); ``release`` it."""
        ...

    def release(self, conn: PooledConnection, *, reusable: bool) -> None:
        """Back to the pool if ``reusable`` and the slot was not forgotten, else closed."""
        ...

    async def forget(self, slot: NetSlot) -> None:
        """Close cached and pooled connections of a slot (released, or being checkpointed),
        including pooled ones in use."""
        ...

    def held(self, slot: NetSlot) -> contextlib.AbstractAsyncContextManager[None]:
        """Inside: new connections to the slot's guest wait, none is mid-handshake."""
        ...
