"""The blob cache's budget: least recently used blobs go, but never one placed so recently that
a commit may still be about to put it from the cache (the long torture's snapshot 500s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.storage import blobs
from aenv.storage.blobs import BlobCache

pytestmark = pytest.mark.anyio


async def _place(cache: BlobCache, tmp: Path, content: bytes) -> str:
    source = tmp / f"src-{content[:4].hex()}"
    source.write_bytes(content)
    ref, _ = await cache.adopt(source)
    return ref.digest


async def test_new_blobs_outlive_the_budget_and_old_ones_go_least_recent_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = BlobCache(tmp_path / "blobs", budget_bytes=2048)
    cache.start()
    digests = [await _place(cache, tmp_path, bytes([i]) * 1024) for i in range(4)]
    assert cache.trim() == []  # all four were just placed: a commit may be putting them
    assert all(cache.has(d) for d in digests)

    monkeypatch.setattr(blobs, "KEEP_NEW_S", 0.0)
    cache._touch(cache.path(digests[0]))  # the oldest is used again: the next two go
    dropped = cache.trim(keep=[digests[3]])
    assert sorted(dropped) == sorted(digests[1:3])
    assert cache.has(digests[0]) and cache.has(digests[3])
    assert cache.usage() == 2048
