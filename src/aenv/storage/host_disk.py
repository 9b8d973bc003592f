"""The host file system under the workspace pool: how full it is, and the watermark above which
the pool takes no new disk.

Owns no path: it reads ``statvfs`` of the file system that holds the pool (for a pool image,
the home's file system, where the image's blocks land; for a pool directory or an operator's
disk, that file system itself) and refuses with :class:`HostDiskFull` once its usage is above
the watermark. Sparse images and thin provisioning make every sandbox a claim on host space
that is only paid when written: without a line drawn before the host disk fills, its last
writers (sandboxes, logs, memory images) fail at random.

Usage is counted as ``df`` shows it: used / (used + available to unprivileged writers), so
100 % is where writes start failing, whatever share the file system reserves for root.

Why 429 with ``Retry-After`` (e2b-compat §2.1-2.2): E2B's control plane has no 507 (the SDK
would raise a bare ``SandboxException("507: …")`` and never retry); 429 is what E2B and this
node answer when capacity is lacking now and may come back (``RateLimitException``, retried by
both SDKs after ``Retry-After``), as the node's start admission and the cluster's
``cluster_full`` do. 503 (``ServiceBusyException``) would say the node is down, while it still
serves every running sandbox.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from aenv.core.errors import ResourceExhausted

#: What a refused client is told to wait: space comes back when sandboxes are killed and freed
#: blocks are trimmed (seconds), and the SDKs' three retries then span ~30 s, inside their
#: default 60 s request timeout.
RETRY_AFTER_S = 10


class HostDiskFull(ResourceExhausted):
    """The host file system under the pool is above its watermark: no new disk is handed out."""


@dataclass(frozen=True)
class DiskUsage:
    """One ``statvfs`` of a file system, in bytes."""

    total_bytes: int
    used_bytes: int
    #: Free to unprivileged writers (``f_bavail``): what ``df`` calls available.
    available_bytes: int

    @property
    def percent(self) -> float:
        """Used share of what can be used, as ``df``'s ``Use%`` (0-100)."""
        usable = self.used_bytes + self.available_bytes
        return 100.0 * self.used_bytes / usable if usable else 100.0


def disk_usage(path: Path) -> DiskUsage:
    """How full the file system holding ``path`` is (blocking: a ``statvfs``)."""
    st = os.statvfs(path)
    return DiskUsage(
        total_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
    )


class Watermark:
    """Refuses new disk while the file system holding ``path`` is above ``percent`` used."""

    def __init__(self, path: Path, percent: float) -> None:
        if not 0 < percent <= 100:
            raise ValueError(f"a disk watermark is a percentage in (0, 100], not {percent}")
        #: A path on the watched file system.
        self.path = path
        #: Above this usage (``df``'s ``Use%``) nothing new is admitted; 100: never refuses.
        self.percent = percent

    def check(self, what: str) -> DiskUsage:
        """The usage now; :class:`HostDiskFull` (429, ``Retry-After``) if above the watermark.

        Blocking (a ``statvfs``): in server code call :meth:`ensure_below`.
        """
        usage = disk_usage(self.path)
        if self.percent < 100 and usage.percent > self.percent:
            raise HostDiskFull(
                f"not enough disk space on this node for {what}: the host file system holding "
                f"the workspaces ({self.path}) is {usage.percent:.1f}% full, above its "
                f"{self.percent:g}% watermark ({usage.available_bytes >> 20} MiB left); "
                f"retry in {RETRY_AFTER_S} s or free space by killing sandboxes",
                retry_after_s=RETRY_AFTER_S)
        return usage

    async def ensure_below(self, what: str) -> DiskUsage:
        """:meth:`check`, off the event loop."""
        return await asyncio.to_thread(self.check, what)
