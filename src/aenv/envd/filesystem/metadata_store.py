"""File metadata where the filesystem has no extended attributes.

E2B keeps a file's metadata in ``user.e2b.*`` xattrs. Under gVisor a root on the host (disk
workspaces: an ext4 image behind runsc's gofer) refuses every xattr: the gofer serves only
fs-verity's (runsc/fsgofer ``SetXattr``: EOPNOTSUPP), and directfs does the same "for
consistency"; no runsc flag of 20240729 changes that. Memory workspaces (the overlay in the
sandbox's memory) and tmpfs mounts have real xattrs and never come here.

So metadata of files on such a filesystem lives in one JSON file inside the sandbox, keyed by
the file's absolute real path. Being on the sandbox's own disk, it is in every pause, snapshot
and fork, and a path means the same thing after a restore (inode numbers do not: gVisor
renumbers them). envd keeps it right for what it does itself (uploads replace, Remove forgets,
Move carries it along); a file a process renames loses it, one a process deletes and recreates
under the same name inherits it. Entries whose file is gone are dropped on the next save.

Only root reads or writes the store's file; a job acting as a user borrows root for that
(``creds.as_root``), after the user's own access to the file succeeded.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from aenv.envd.filesystem.creds import as_root

#: Outside every home and the usual working directories; root-only.
STORE_DIR = "/var/lib/aenv-envd"
STORE_NAME = "file-metadata.json"


class MetadataStore:
    def __init__(self, directory: str = STORE_DIR) -> None:
        self.directory = directory
        self.path = os.path.join(directory, STORE_NAME)
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, str]] = {}
        self._loaded = False

    def get(self, real_path: str) -> dict[str, str]:
        with self._lock:
            self._load_locked()
            found = self._entries.get(real_path)
            return dict(found) if found else {}

    def has_entries(self) -> bool:
        with self._lock:
            self._load_locked()
            return bool(self._entries)

    def put(self, real_path: str, metadata: Mapping[str, str]) -> None:
        """Replace the metadata of ``real_path``; empty forgets it."""
        with self._lock:
            self._load_locked()
            if not metadata and real_path not in self._entries:
                return
            if metadata:
                self._entries[real_path] = dict(metadata)
            else:
                del self._entries[real_path]
            self._save_locked()

    def forget_tree(self, real_path: str) -> None:
        """Drop ``real_path`` and everything below it (after a removal)."""
        with self._lock:
            self._load_locked()
            doomed = [p for p in self._entries if _within(p, real_path)]
            if doomed:
                for p in doomed:
                    del self._entries[p]
                self._save_locked()

    def move_tree(self, source: str, destination: str) -> None:
        """Re-key ``source`` and everything below it under ``destination`` (after a move)."""
        with self._lock:
            self._load_locked()
            moved = {p: m for p, m in self._entries.items() if _within(p, source)}
            stale = [p for p in self._entries if _within(p, destination)]
            if not moved and not stale:
                return
            for p in (*moved, *stale):
                self._entries.pop(p, None)
            for p, m in moved.items():
                self._entries[destination + p[len(source) :]] = m
            self._save_locked()

    def _load_locked(self) -> None:
        """Read the file once: envd is its only writer, and its memory is checkpointed with
        the disk (a resume, fork or snapshot restore finds both as they were), so what it holds
        stays true; an envd started afresh (a filesystem-only resume) reads it again."""
        if self._loaded:
            return
        try:
            with as_root(), open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError):
            data = {}  # a torn or foreign file: metadata is best kept, never fatal
        files = data.get("files") if isinstance(data, dict) else None
        self._entries = {
            str(p): {str(k): str(v) for k, v in m.items()}
            for p, m in (files if isinstance(files, dict) else {}).items()
            if isinstance(m, dict)
        }
        self._loaded = True

    def _save_locked(self) -> None:
        with as_root():
            self._entries = {p: m for p, m in self._entries.items() if _is_file(p)}
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"version": 1, "files": self._entries}, f, separators=(",", ":"))
                    f.flush()
                    os.fsync(f.fileno())
                Path(tmp).replace(self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    Path(tmp).unlink()
                raise


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


_store: MetadataStore | None = None


def store() -> MetadataStore:
    global _store
    if _store is None:
        _store = MetadataStore()
    return _store
