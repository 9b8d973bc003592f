"""Disk workspaces: a parent's disk as its last fork saw it, kept so that its next fork's
children can be created ahead.

A fork child's disk is a clone of its parent's disk taken at the fork, and the runtime binds a
sandbox's disk when the sandbox is created: so a child can come from the pre-created pool only
if its disk could be made before the fork. It can when the parent did not change its files
since its previous fork, which is what a trainer's prepared parent does between waves. So
after a fork the clone it took (the *seed*) is kept as ``<pool>/clones/<parent>.<n>.fork.img``
and the pre-created pool makes sandboxes on clones of it; the next fork compares the clone it
takes with the kept one (``storage/disk_compare.py``: FIEMAP, then the bytes of what is
mapped apart) and, when they hold the same files, its children use the kept seed — and so the
sandboxes made ahead on it. When they differ, the new clone is kept instead and the pool
changes shape (what it made of the old one is destroyed).

One kept seed per forked parent, dropped at the parent's kill (``disk_mode.forget``); one a
crash left goes with the parent's directory (``disk_mode.drop_stale_disks``). A kept seed
costs the blocks the parent rewrote since (a reflink clone shares the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from pathlib import Path

from aenv.orchestrator.context import Node
from aenv.storage.disk_compare import same_files

log = logging.getLogger("aenv.orchestrator.fork_seeds")

SUFFIX = ".fork.img"


def kept_seeds(clones: Path, parent_id: str) -> list[Path]:
    """The seeds kept for ``parent_id`` (normally one) in the clones directory."""
    return sorted(clones.glob(f"{parent_id}.*{SUFFIX}"))


def parent_of(seed: Path) -> str | None:
    """The parent a kept seed belongs to, or None for another kind of clone."""
    if not seed.name.endswith(SUFFIX):
        return None
    return seed.name[: -len(SUFFIX)].rsplit(".", 1)[0]


async def reuse(parent_id: str, seed: Path) -> Path:
    """The disk this fork's children start from: the seed kept from the parent's previous
    fork when it holds the same files as ``seed`` (then the pool's sandboxes fit), else
    ``seed``. Never fails: a comparison that cannot be made keeps ``seed``."""
    for kept in kept_seeds(seed.parent, parent_id):
        try:
            if await asyncio.to_thread(same_files, kept, seed):
                return kept
        except OSError as exc:
            log.warning("could not compare %s with %s: %s", kept.name, seed.name, exc)
    return seed


async def settle(node: Node, parent_id: str, used: Path, seed: Path) -> Path | None:
    """After the fork's children were made from ``used``: keep what the next fork of the
    parent compares with, and drop the rest. The kept seed, or None when nothing is kept
    (the pre-created pool is off)."""
    if used != seed:  # the kept seed served: this fork's clone is not needed
        seed.unlink(missing_ok=True)
        return used
    if node.precreated.size <= 0:
        seed.unlink(missing_ok=True)
        return None
    previous = kept_seeds(seed.parent, parent_id)
    # A new name for new contents: the pool tells its sandboxes' shapes apart by path.
    kept = seed.with_name(f"{parent_id}.{secrets.token_hex(4)}{SUFFIX}")
    await asyncio.to_thread(seed.rename, kept)
    for old in previous:
        old.unlink(missing_ok=True)
    return kept


def forget(clones: Path, parent_id: str) -> None:
    """Drop the seeds kept for ``parent_id`` (at its kill)."""
    for kept in kept_seeds(clones, parent_id):
        with contextlib.suppress(FileNotFoundError):
            kept.unlink()
