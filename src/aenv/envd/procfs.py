"""Remount the sandbox's ``/proc`` with a small dentry cache (gVisor 20240729 work-around).

In this runsc, a short-lived program that looks up its own ``/proc/<pid>`` (busybox, ``ps``,
``node`` read ``/proc/self/exe``) leaves that entry and its dead task in procfs's lookup cache,
which holds up to 1,000 entries: each adds ~1,730 kernel objects to every later checkpoint
(after 1,000 such programs a save takes 5.4 s instead of 16 ms). ``dentry_cache_limit=10``
bounds that; 0 would make every /proc lookup 4-15x slower. Fixed upstream in 20241217.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("envd.procfs")

_MNT_DETACH = 2
DENTRY_CACHE_LIMIT = 10


def remount_proc(limit: int = DENTRY_CACHE_LIMIT) -> bool:
    """Replace ``/proc`` by a procfs with ``dentry_cache_limit=limit``; False if not allowed
    (not root, or not gVisor: Linux rejects the option and the old /proc stays)."""
    libc = ctypes.CDLL(None, use_errno=True)  # the running interpreter's own libc
    options = f"dentry_cache_limit={limit}".encode()
    # Mount first, over the old one: if the option is refused nothing has changed.
    if libc.mount(b"proc", b"/proc", b"proc", 0, options) != 0:
        log.warning("cannot remount /proc: %s", os.strerror(ctypes.get_errno()))
        return False
    return True
