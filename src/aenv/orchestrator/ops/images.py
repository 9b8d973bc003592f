"""The node's OCI image cache as ``GET /images`` shows it (aenv's own route).

Reads only: the pulled references (``storage/images.py``' records), how many of each one's
layers are unpacked now (a stat per layer, in a worker thread), and the progress lines of
pulls under way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aenv.orchestrator.context import Node
from aenv.storage.images import ImageStore
from aenv.storage.oci_image import PulledImage


@dataclass(frozen=True)
class CachedImage:
    reference: str
    #: The last progress line of a pull of it under way (None: none).
    progress: str | None
    #: None for a reference still being pulled for the first time: nothing is known yet.
    manifest_digest: str | None = None
    layers: int = 0
    layers_cached: int = 0
    compressed_bytes: int = 0


async def cached_images(node: Node) -> list[CachedImage]:
    """Every pulled reference, then the references being pulled for the first time.

    Prerequisites: none.
    On success: one entry per reference. On failure: none expected (unreadable records are
    skipped by the store).
    """
    images = node.images
    records = await asyncio.to_thread(images.records)
    pulled = [p for p, _ in records]
    cached = await asyncio.to_thread(_cached_counts, images, pulled)
    progress = images.in_flight()  # on the loop: the pulls update it there
    found = [
        CachedImage(
            reference=p.source, progress=progress.pop(p.source, None),
            manifest_digest=p.manifest_digest, layers=len(p.layers), layers_cached=count,
            compressed_bytes=sum(d.size for d in p.layers))
        for p, count in zip(pulled, cached, strict=True)
    ]
    found.extend(CachedImage(reference=ref, progress=line) for ref, line in progress.items())
    return found


def _cached_counts(images: ImageStore, pulled: list[PulledImage]) -> list[int]:
    return [sum(images.layers.has(d.diff_id.partition(":")[2]) for d in p.layers)
            for p in pulled]
