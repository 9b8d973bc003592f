"""The host source of every unused volume slot (``envd/volume_binds.py``): an empty tmpfs,
mounted read-only.

A slot is bound read-write in the sandbox (a restore keeps the flags its checkpoint had, and
a template's slots later hold volumes users write), so what refuses writes to an unused
slot must be its source: a read-only mount on the host refuses even the gofer, which runs
with the privilege to ignore permission bits. One per driver's state directory, made at
first use and kept while sandboxes may use it (they outlive a server restart).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from aenv.core import proc
from aenv.envd.volume_binds import ROOT_MODE

#: Its root looks like a volume's (``ROOT_MODE``, root's): a sandbox restored from an image
#: taken with this in a slot keeps seeing these attributes on that slot's root.
_OPTIONS = f"ro,nosuid,nodev,noexec,size=4k,nr_inodes=16,mode={ROOT_MODE:o},uid=0,gid=0"


class SlotFiller:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()
        self._ready = False

    async def ensure(self) -> Path:
        """The read-only empty directory, mounted if it is not yet (idempotent; a mount left
        by an earlier process is used as it is)."""
        if self._ready:
            return self.path
        async with self._lock:
            if not self._ready:
                self.path.mkdir(parents=True, exist_ok=True)
                if not os.path.ismount(self.path):
                    await proc.run(["mount", "-t", "tmpfs", "-o", _OPTIONS, "aenv-slot-filler",
                                    str(self.path)], timeout=30.0)
                self._ready = True
        return self.path

    async def remove(self) -> None:
        """Detach it (lazily: a running sandbox's gofer may hold it; it keeps its view)."""
        async with self._lock:
            if os.path.ismount(self.path):
                await proc.run(["umount", "--lazy", str(self.path)], timeout=30.0)
            self._ready = False
