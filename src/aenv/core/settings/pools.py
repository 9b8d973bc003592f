"""The pools kept ready ahead of requests: network slots, warm and pre-created sandboxes."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class PoolSettings(Section):
    """Pools: network slots, warm and pre-created sandboxes kept ready ahead of requests."""

    net_pool_size: int = Field(default=24, ge=0)
    """Network slots kept prepared ahead of creates (refilled below half): a fork of 16 takes
    16 at once next to the warm pool's, and making one costs 12-40 ms (seconds while 16
    restores share two cores)."""

    warm_pool_size: int = Field(default=2, ge=0)
    """High watermark: sandboxes of the default template restored from its memory image and
    kept ready, so a create only initialises one (milliseconds instead of a restore). Each
    costs an idle sandbox's memory; 0 disables."""

    warm_pool_low: int | None = Field(default=None, ge=0)
    """Low watermark: refilling starts when fewer are ready (then fills up to the high one).
    Unset: refill after every claim."""

    precreate_pool_size: int = Field(default=16, ge=0, le=256)
    """Sandboxes created ahead but not started (network slot, rootfs, runsc's processes), for
    restores of one shape: the last fork's parent (or, before any fork, the default
    template). A fork child or a create the warm pool cannot serve is restored into one in
    ~95 ms instead of ~180 ms. Each costs ~12 MiB and one network slot while it waits; a
    fork of 16 children wants 16. With disk workspaces a parent's first fork finds none (its
    children's disk does not exist before it); its next ones do while its files stay the
    same. 0 disables."""

    precreate_pool_max: int = Field(default=64, ge=0, le=256)
    """How far the pre-created pool grows while recent demand asks for more at once than
    ``precreate_pool_size``: a fork of N children, or creates (an RL group's, a fan-out) that
    came within a second of each other. Each sandbox costs ~12 MiB and a network slot while
    it waits. Below ``precreate_pool_size``: no growth."""

    precreate_demand_window_s: float = Field(default=600.0, gt=0)
    """How long a demand keeps the pre-created pool above ``precreate_pool_size``; after it,
    the extra sandboxes are destroyed."""

    resume_ready_size: int = Field(default=8, ge=0, le=256)
    """With disk workspaces: how many sandboxes paused to disk the node keeps ready to
    resume, the most recently paused ones. A runtime sandbox is created on the paused
    sandbox's own disk in a network slot, so its resume restores into it (~95 ms) instead of
    creating one first (~180 ms). Each costs ~12 MiB and one network slot while it waits; a
    sandbox that finds no free slot takes one's. 0 disables."""

    resume_ready_s: float = Field(default=600.0, gt=0)
    """How long a paused sandbox is kept ready to resume (then only its image on disk
    remains, and a resume creates its runtime sandbox first)."""
