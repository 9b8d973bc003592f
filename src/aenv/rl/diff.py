"""The diff of a rollout against its prepared state: files added, changed and removed.

What SWE-style tasks grade, and what a trainer logs. Computed in two round trips per side
rather than by copying trees:

1. a **manifest** (path → size, mode, sha256, text or not) taken inside the sandbox by a small
   python3 script fed on stdin (the base template has python3; nothing is written into the
   sandbox, so taking the parent's manifest does not change the state its rollouts fork from).
   The parent's is taken once, at prepare time; the rollout's after the agent is done;
2. comparing the two manifests here (pure: :func:`compare`), then reading **only the changed
   text files** from both sides: the old version from the prepared parent, unchanged while
   its rollouts run (running, or paused and resumed for the read: ``baseline.py``), the new
   one from the rollout.

Binary files and text files past ``max_text_bytes`` carry sizes and hashes only; past
``max_patches`` files, further changes carry no patch either (``Diff.truncated``). Directories
named in ``exclude`` (``.git``, ``__pycache__`` by default) are not walked: byte-code and git's
object store churn on every command and say nothing about the agent's change. Symlinks are
recorded by target, not followed.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aenv.client import ClientError, Sandbox

#: Directory names not walked (see the module docstring).
DEFAULT_EXCLUDE = (".git", "__pycache__", ".pytest_cache", ".mypy_cache", "node_modules")
#: A text file larger than this gets no unified diff: a patch nobody reads, fetched twice.
MAX_TEXT_BYTES = 256 * 1024
#: At most this many files are fetched for patches per diff; a rollout that rewrote a whole
#: tree still gets its (cheap) manifest comparison.
MAX_PATCHES = 200
#: Reads in flight per diff (each is one envd HTTP request).
READ_PARALLELISM = 8
#: The manifest script's time limit: hashing a large workdir takes seconds, not minutes.
MANIFEST_TIMEOUT_S = 120.0

# Runs inside the sandbox (python3 of the template); argv[1] is a JSON config. Prints one JSON
# object {path: [size, mode, sha256, is_text]}. Unreadable files are skipped, not fatal: the
# manifest describes what the agent could have changed, and it could not read those either.
_MANIFEST_SCRIPT = r"""
import hashlib, json, os, stat, sys
cfg = json.loads(sys.argv[1])
exclude, cap = set(cfg["exclude"]), cfg["max_text_bytes"]
out = {}
def entry(path):
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path).encode("utf-8", "surrogateescape")
        digest = "link:" + hashlib.sha256(target).hexdigest()
        return [len(target), stat.S_IMODE(st.st_mode), digest, False]
    if not stat.S_ISREG(st.st_mode):
        return None
    h, text, head = hashlib.sha256(), st.st_size <= cap, b""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            if text and len(head) < cap:
                head += block
    if text:
        try:
            text = b"\0" not in head and (head.decode("utf-8") or True)
        except UnicodeDecodeError:
            text = False
    return [st.st_size, stat.S_IMODE(st.st_mode), h.hexdigest(), bool(text)]
for root in cfg["roots"]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in exclude)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in sorted(filenames) + links:
            path = os.path.join(dirpath, name)
            try:
                e = entry(path)
            except OSError:
                continue
            if e is not None:
                out[path] = e
json.dump(out, sys.stdout)
"""


class FileSource(Protocol):
    """Where a side of a diff is read from: a :class:`~aenv.client.Sandbox`, or the
    prepared parent through ``baseline.Baseline``."""

    async def read_file(self, path: str) -> str: ...


@dataclass(frozen=True)
class FileEntry:
    """One file of a manifest. ``sha256`` starts ``link:`` for a symlink (then of its target)."""

    size: int
    mode: int
    sha256: str
    text: bool


#: path → entry: what a sandbox's roots held when the manifest was taken.
Manifest = dict[str, FileEntry]


@dataclass(frozen=True)
class FileChange:
    """A file added, changed or removed; ``patch`` is its unified diff (None for binary files,
    files past the size cap, or past ``max_patches``)."""

    path: str
    old: FileEntry | None
    new: FileEntry | None
    patch: str | None = None

    @property
    def binary(self) -> bool:
        return not all(e.text for e in (self.old, self.new) if e is not None)


@dataclass(frozen=True)
class Diff:
    """A rollout's files against its prepared state, each list sorted by path."""

    added: list[FileChange] = field(default_factory=list)
    changed: list[FileChange] = field(default_factory=list)
    removed: list[FileChange] = field(default_factory=list)
    #: Some changes carry no patch because of ``max_patches``.
    truncated: bool = False

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    @property
    def paths(self) -> list[str]:
        return sorted(c.path for c in (*self.added, *self.changed, *self.removed))

    def unified(self) -> str:
        """One ``git apply``-style text: every patch, then a line per file without one."""
        parts: list[str] = []
        for change in sorted((*self.added, *self.changed, *self.removed), key=lambda c: c.path):
            if change.patch is not None:
                parts.append(change.patch)
            elif change.old is None or change.new is None or change.old.sha256 != change.new.sha256:
                old = f"{change.old.size} bytes {change.old.sha256[:12]}" if change.old else "none"
                new = f"{change.new.size} bytes {change.new.sha256[:12]}" if change.new else "none"
                parts.append(f"Binary or large file {change.path}: {old} -> {new}\n")
            else:  # only the mode changed
                parts.append(f"Mode of {change.path}: {change.old.mode:o} -> "
                             f"{change.new.mode:o}\n")
        return "".join(parts)


async def take_manifest(sandbox: Sandbox, roots: Iterable[str], *,
                        exclude: Iterable[str] = DEFAULT_EXCLUDE,
                        max_text_bytes: int = MAX_TEXT_BYTES) -> Manifest:
    """The manifest of ``roots`` in ``sandbox`` (a missing root contributes nothing)."""
    config = json.dumps({"roots": list(roots), "exclude": list(exclude),
                         "max_text_bytes": max_text_bytes})
    result = await sandbox.run(f"python3 - {shlex.quote(config)}", stdin=_MANIFEST_SCRIPT,
                               timeout=MANIFEST_TIMEOUT_S, check=True)
    raw = json.loads(result.stdout)
    return {str(path): FileEntry(int(e[0]), int(e[1]), str(e[2]), bool(e[3]))
            for path, e in raw.items()}


@dataclass(frozen=True)
class Plan:
    """What :func:`compare` found: the paths on each list, before any content is fetched."""

    added: list[str]
    changed: list[str]
    removed: list[str]


def compare(old: Mapping[str, FileEntry], new: Mapping[str, FileEntry]) -> Plan:
    """Pure: which paths were added, changed (content or mode) and removed."""
    return Plan(added=sorted(set(new) - set(old)),
                changed=sorted(p for p in set(old) & set(new) if old[p] != new[p]),
                removed=sorted(set(old) - set(new)))


async def diff(parent: FileSource, base: Manifest, rollout: Sandbox, roots: Iterable[str], *,
               exclude: Iterable[str] = DEFAULT_EXCLUDE, max_text_bytes: int = MAX_TEXT_BYTES,
               max_patches: int = MAX_PATCHES) -> Diff:
    """``rollout``'s files under ``roots`` against ``base``, the manifest of ``parent``.

    Prerequisites: ``parent`` reads files unchanged since ``base`` was taken (the prepared
    state); ``rollout`` is running.
    On success: the :class:`Diff`. On failure: the client's errors (``SandboxLost`` …)."""
    current = await take_manifest(rollout, roots, exclude=exclude, max_text_bytes=max_text_bytes)
    plan = compare(base, current)
    gate = asyncio.Semaphore(READ_PARALLELISM)
    budget = [max_patches]

    async def read(sandbox: FileSource, path: str) -> str | None:
        async with gate:
            try:
                return await sandbox.read_file(path)
            except ClientError:
                return None  # vanished or unreadable since the manifest: no patch, not fatal

    async def change(path: str) -> FileChange:
        old, new = base.get(path), current.get(path)
        sides = [e for e in (old, new) if e is not None]
        if not all(e.text and not e.sha256.startswith("link:") for e in sides) or \
                (old is not None and new is not None and old.sha256 == new.sha256):
            return FileChange(path, old, new)
        if budget[0] <= 0:
            return FileChange(path, old, new)
        budget[0] -= 1
        before, after = await asyncio.gather(
            read(parent, path) if old else _none(), read(rollout, path) if new else _none())
        if (old and before is None) or (new and after is None):
            return FileChange(path, old, new)
        return FileChange(path, old, new, _unified(path, before, after))

    added, changed, removed = await asyncio.gather(
        asyncio.gather(*(change(p) for p in plan.added)),
        asyncio.gather(*(change(p) for p in plan.changed)),
        asyncio.gather(*(change(p) for p in plan.removed)))
    patched = [c for c in (*added, *changed, *removed) if c.patch is not None]
    wanted = [c for c in (*added, *changed, *removed)
              if not c.binary and not (c.old and c.new and c.old.sha256 == c.new.sha256)]
    return Diff(list(added), list(changed), list(removed),
                truncated=len(patched) < len(wanted) and budget[0] <= 0)


async def _none() -> None:
    return None


def _unified(path: str, before: str | None, after: str | None) -> str:
    """``git diff``'s header shape, so the text is readable by ``git apply`` and people."""
    old_name = f"a{path}" if before is not None else "/dev/null"
    new_name = f"b{path}" if after is not None else "/dev/null"
    lines = difflib.unified_diff((before or "").splitlines(keepends=True),
                                 (after or "").splitlines(keepends=True), old_name, new_name)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)

