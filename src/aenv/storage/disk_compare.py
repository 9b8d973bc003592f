"""Whether two frozen clones of one sandbox's disk hold the same files.

Both are reflink clones of the same image, each taken while its ext4 was frozen. A block the
sandbox did not write between the two instants is the same physical block in both
(``FIEMAP``: logical → physical), so only ranges mapped differently can differ, and those are
read and compared. The image's first 4 KiB block is left out of the comparison: it holds
ext4's primary superblock, which every freeze and thaw rewrites (its write count and times,
measured 2026-12-07: two clones of an idle disk differ in that block and nowhere else); what
the sandbox sees of the disk is never there.

Owns nothing: it reads the two files.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from aenv.storage.disk_chunks import extents

#: The block left out: ext4's primary superblock (at offset 1,024) and what precedes it.
SUPERBLOCK_BLOCK = 4096
#: Differing ranges worth reading and comparing: beyond this many bytes the disks are taken
#: as different without reading them (a sandbox that wrote this much changed its files).
COMPARE_LIMIT = 8 << 20
_READ = 1 << 20

#: ``(logical start, physical start, length)``, logical order, as ``extents`` gives them.
Extent = tuple[int, int, int]


def same_files(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` (same size) are equal outside their first 4 KiB block.
    Blocking: call it in a thread."""
    if a.stat().st_size != b.stat().st_size:
        return False
    ranges = [(max(lo, SUPERBLOCK_BLOCK), hi) for lo, hi in mapped_apart(extents(a), extents(b))
              if hi > SUPERBLOCK_BLOCK]
    if sum(hi - lo for lo, hi in ranges) > COMPARE_LIMIT:
        return False
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        for lo, hi in ranges:
            offset = lo
            while offset < hi:
                size = min(_READ, hi - offset)
                if os.pread(fa.fileno(), size, offset) != os.pread(fb.fileno(), size, offset):
                    return False
                offset += size
    return True


def mapped_apart(a: list[Extent], b: list[Extent]) -> Iterator[tuple[int, int]]:
    """The byte ranges ``[lo, hi)`` that ``a`` and ``b`` map differently: to other physical
    blocks, or data in one and a hole in the other. Extent boundaries may fall differently
    in the two lists; only the mapping counts."""
    edges = sorted({e for lo, _, n in (*a, *b) for e in (lo, lo + n)})
    run: tuple[int, int] | None = None
    for lo, hi in itertools.pairwise(edges):
        if _physical(a, lo) == _physical(b, lo):
            continue
        if run is not None and run[1] == lo:
            run = (run[0], hi)
        else:
            if run is not None:
                yield run
            run = (lo, hi)
    if run is not None:
        yield run


def _physical(extent_list: list[Extent], offset: int) -> int | None:
    """Where ``offset`` lies on the device, or None in a hole."""
    at = bisect.bisect_right(extent_list, offset, key=lambda extent: extent[0]) - 1
    if at < 0:
        return None
    start, physical, length = extent_list[at]
    return physical + (offset - start) if offset < start + length else None
