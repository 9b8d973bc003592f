"""Volume mount slots: how a sandbox restored from a memory image gets its own volumes.

A runsc restore brings back only the mounts its checkpoint was taken with (their sources
may differ; their destinations may not), and a template's memory image is taken before
anyone asks for a volume. So every sandbox whose envd bundle carries :data:`MARKER` is
started with :func:`slot_count` *slots*: binds at ``SLOTS_DIR/<k>`` whose host source is an
empty read-only directory, or the k-th volume of that sandbox (the node picks the source,
``runtime/oci.py``). At ``POST /init`` the node names, for each volume, its slot and the
path the user asked for, and :func:`apply` binds the slot there. The binds live in the
sandbox's kernel, so a pause, a fork child and a snapshot keep them; a restore only has to
give each slot the same volume again (the node keeps the order).

Read-only is enforced on the host (a reader's slot source is a read-only bind there); the
read-only remount here only makes ``mount`` inside tell the truth.

Owns the binds it made (in :class:`Binds`, which lives in envd's memory and so in every
checkpoint); nothing else. Must never run on a host: only the sandbox's envd calls it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

#: Where the slots are mounted inside the sandbox.
SLOTS_DIR = "/opt/aenv/volumes"
#: A file in the envd bundle: its content is the number of slots sandboxes of that bundle
#: have. A bundle without it (made before slots) has none: its images restore without them.
MARKER = "volume-slots"
#: Slots of the bundles made now; also the most volumes one sandbox may mount.
SLOTS = 4
#: The mode of a volume's root (root's; everyone may create files in it, the sticky bit
#: keeps users from removing each other's), and of the empty source of an unused slot: a
#: restored sandbox keeps the attributes its checkpoint saw of a slot's root (the sentry
#: never looks them up again), so the two must agree.
ROOT_MODE = 0o1777

_MS_RDONLY = 0x1
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_REC = 0x4000


def slot_path(index: int) -> str:
    return f"{SLOTS_DIR}/{index}"


@functools.lru_cache(maxsize=64)
def slot_count(envd_bundle: Path) -> int:
    """How many slots sandboxes of ``envd_bundle`` have (0: an older bundle). Host side;
    read once per bundle (the node's bundles are immutable copies)."""
    try:
        return int((envd_bundle / MARKER).read_text().strip())
    except (OSError, ValueError):
        return 0


@dataclass(frozen=True)
class SlotBind:
    """One volume inside the sandbox: slot ``slot`` shown at ``path``."""

    slot: int
    path: str
    read_only: bool = False

    @classmethod
    def parse(cls, raw: object) -> SlotBind:
        """From ``/init``'s ``volumeMounts`` entry; ``ValueError`` if malformed."""
        if not isinstance(raw, dict):
            raise ValueError("a volume mount must be an object")
        slot, path, read_only = raw.get("slot"), raw.get("path"), raw.get("readOnly", False)
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < SLOTS:
            raise ValueError(f"a volume mount's slot must be 0 to {SLOTS - 1}")
        if (not isinstance(path, str) or not path.startswith("/") or "\0" in path
                or posixpath.normpath(path) != path or path == "/"):
            raise ValueError(f"a volume mount's path must be a normalised absolute path: {path!r}")
        if not isinstance(read_only, bool):
            raise ValueError("a volume mount's readOnly must be a boolean")
        return cls(slot, path, read_only)


@dataclass
class Binds:
    """The binds this envd made: path → its bind."""

    made: dict[str, SlotBind] = field(default_factory=dict)

    def apply(self, wanted: list[SlotBind]) -> None:
        """Bind each slot at its path, shallowest path first (a volume may sit inside
        another's). A bind already made as asked (a fork child, a snapshot's sandbox) is left
        as it is. Raises ``ValueError`` for a path taken by another bind or that is not a
        directory, ``OSError`` if the kernel refuses."""
        for bind in sorted(wanted, key=lambda b: b.path.count("/")):
            done = self.made.get(bind.path)
            if done is not None:
                if done.slot != bind.slot:
                    raise ValueError(f"{bind.path} already shows another volume")
                continue
            _make_mount_point(bind.path)
            _mount(slot_path(bind.slot), bind.path, _MS_BIND | _MS_REC)
            if bind.read_only:
                try:
                    _mount(None, bind.path, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
                except OSError:
                    pass  # the host's read-only source still refuses every write
            self.made[bind.path] = bind


def _make_mount_point(path: str) -> None:
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} exists and is not a directory")
    # 0755 and root's, as the mount point; what users see is the volume's own root.
    os.makedirs(path, mode=0o755, exist_ok=True)


def _mount(source: str | None, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)  # the running interpreter's own libc
    if libc.mount(source.encode() if source else None, target.encode(), None, flags,
                  None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot bind {source or target} at {target}: "
                             f"{os.strerror(errno)}")
