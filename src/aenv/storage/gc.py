"""Garbage collection of the repository: delete blobs no committed manifest names.

Observe → plan → apply. *Observe* lists every manifest and every blob of the store. *Plan*
(:func:`plan_collection`, pure, tested row by row) keeps a blob when:

- a committed manifest names it (snapshots, templates, paused sandboxes — any node's);
- it was written less than ``grace_s`` ago: a commit in flight on some node has put its blobs
  and not yet its manifest (blobs first, manifest last);
- it is not a blob key at all (a foreign object, or an upload's temporary name younger than the
  grace; older ones are leftovers of crashed writers and go).

*Apply* deletes what the plan lists. On this node GC and commits exclude each other (the
repository's commit gate), so a commit never skips a blob this pass is deleting. Across nodes
the grace covers commits in flight, and a commit checks after writing its manifest that the
blobs it found already present are still there (and puts back any that a GC on another node
deleted in between: the repository's ``_recheck``).

Running sandboxes need no entry here: their layers are on their node's disk, and a snapshot
of them puts the layer blob again if it has gone. Incomplete S3 multipart uploads are invisible
to listing; the bucket's lifecycle rule for them is the operator's (docs/repository.md).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from aenv.storage.blobs import BLOB_PREFIX, digest_of_key
from aenv.storage.objects import ObjectInfo

log = logging.getLogger("aenv.storage.gc")

#: How long a blob without a manifest is kept: longer than any commit takes (a commit of a
#: large memory image to a slow S3 endpoint: minutes).
DEFAULT_GRACE_S = 3600.0


@dataclass(frozen=True)
class CollectionPlan:
    delete: tuple[str, ...]
    kept_referenced: int
    kept_young: int
    freed_bytes: int


def plan_collection(
    blobs: Iterable[ObjectInfo],
    referenced: set[str],
    *,
    now: datetime.datetime,
    grace_s: float,
) -> CollectionPlan:
    """Which objects under ``blobs/`` to delete (pure)."""
    delete: list[str] = []
    referenced_kept = young = freed = 0
    for info in blobs:
        if not info.key.startswith(BLOB_PREFIX):
            continue
        age = (now - info.modified).total_seconds()
        digest = digest_of_key(info.key)
        if digest is not None and digest in referenced:
            referenced_kept += 1
            continue
        if age < grace_s:
            young += 1
            continue
        delete.append(info.key)
        freed += info.size
    return CollectionPlan(tuple(sorted(delete)), referenced_kept, young, freed)
