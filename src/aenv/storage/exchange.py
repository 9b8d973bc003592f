"""Swap two directories atomically: ``renameat2(2)`` with ``RENAME_EXCHANGE``.

Python's ``os`` has no ``renameat2``; this is the one call, through ctypes (glibc ≥ 2.28). A
swap is what lets a sandbox take over another's directory crash-safely: at every instant each
name holds one whole directory (two renames would leave a moment with neither).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> None:
    """Swap what the names ``a`` and ``b`` (both existing, on one filesystem) point at.
    On failure: ``OSError`` (nothing changed), e.g. ``EINVAL`` where the filesystem cannot
    exchange."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                       _RENAME_EXCHANGE) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), str(a), None, str(b))
