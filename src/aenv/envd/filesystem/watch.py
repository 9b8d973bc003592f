"""inotify-backed directory watchers for ``WatchDir`` and the polled ``CreateWatcher`` API.

Each :class:`Watcher` owns one inotify instance. The event loop drains its descriptor as soon as
it is readable, so recursive watches follow new subdirectories before anything is written into
them, and :meth:`Watcher.pump` can also be called synchronously: ``GetWatcherEvents`` pumps before
answering, so a write that completed just before the call is always in the answer (the kernel
queues the event inside the ``write(2)`` itself).

Events are mapped like E2B's envd (fsnotify): CREATE (``IN_CREATE``/``IN_MOVED_TO``), WRITE
(``IN_MODIFY``), REMOVE (``IN_DELETE``/``IN_DELETE_SELF``), RENAME (``IN_MOVED_FROM``/
``IN_MOVE_SELF``), CHMOD (``IN_ATTRIB``); names are relative to the watched directory. Identical
consecutive undelivered events are merged, as the kernel itself does, so one upload reports one
WRITE however many chunks it was written in.

This module must not resolve user paths or check the request user: the service does that.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import posixpath
import secrets
import time
from collections.abc import Iterable
from typing import Any

from inotify_simple import INotify, flags

from aenv.core.errors import AenvError, Internal, NotFound, ResourceExhausted
from aenv.envd.filesystem.entry import NameCache, entry_info, wire_str
from aenv.envd.gen import filesystem_pb as pb

#: What fsnotify subscribes to; access/open/close events are not reported by envd.
_MASK = (
    flags.CREATE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE | flags.DELETE_SELF
    | flags.MOVE_SELF | flags.MODIFY | flags.ATTRIB
)
#: Subdirectories are watched as themselves, never through a symlink.
_SUBDIR_MASK = _MASK | flags.ONLYDIR | flags.DONT_FOLLOW

_TYPES: tuple[tuple[int, pb.EventType], ...] = (
    # fsnotify's order of operations within one event.
    (flags.CREATE | flags.MOVED_TO, pb.EventType.CREATE),
    (flags.MOVED_FROM | flags.MOVE_SELF, pb.EventType.RENAME),
    (flags.ATTRIB, pb.EventType.CHMOD),
    (flags.MODIFY, pb.EventType.WRITE),
    (flags.DELETE | flags.DELETE_SELF, pb.EventType.REMOVE),
)

#: A polled watcher nobody polls must not grow without bound; past this it reports an error
#: (like an inotify queue overflow) instead of silently dropping events.
MAX_PENDING_EVENTS = 100_000
#: How long a scan's CREATE for a path hides the kernel's own CREATE for it.
SYNTHESIZED_TTL_S = 2.0


class Watcher:
    """One watched directory (optionally its whole tree) and the events not yet delivered."""

    def __init__(self, root: str, *, recursive: bool, include_entry: bool) -> None:
        self.root = root
        self.recursive = recursive
        self.include_entry = include_entry
        self.error: AenvError | None = None
        self.changed = asyncio.Event()
        self._pending: list[pb.FilesystemEvent] = []
        self._last: tuple[str, pb.EventType] | None = None
        self._paths: dict[int, str] = {}
        self._moved_dirs: dict[int, str] = {}
        #: Paths reported as CREATE by a scan → when: the kernel's own CREATE for such a path
        #: may still be queued, in this read or a later one, and must not be reported twice.
        self._synthesized: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as exc:
            raise ResourceExhausted(f"cannot create an inotify instance: {exc.strerror}") from exc

    # -- setup (may run in a worker thread: nothing reads the descriptor yet) ------------------

    def add_initial_watches(self) -> None:
        """Watch the root (and, when recursive, every directory below it, without symlinks)."""
        try:
            self._add(self.root, _MASK | flags.ONLYDIR)
        except OSError as exc:
            self.close()
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise NotFound(f"path {self.root} not found") from exc
            raise _watch_error(exc) from exc
        if self.recursive:
            self._add_tree(self.root, synthesize=False)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._inotify.fileno(), self.pump)

    def _add(self, path: str, mask: int) -> None:
        wd = self._inotify.add_watch(path, mask)
        self._paths[wd] = path

    def _add_tree(self, top: str, *, synthesize: bool) -> None:
        """Watch every directory under ``top``; with ``synthesize``, report what is already there.

        A directory created inside a recursive watch may get entries before its own watch
        exists; those would be lost, so its contents are reported as CREATE events (the real
        duplicate, if the kernel reported one too, is dropped in :meth:`_convert`).
        """
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            if synthesize:
                for name in itertools.chain(dirnames, filenames):
                    full = posixpath.join(dirpath, name)
                    self._synthesized[full] = time.monotonic()
                    self._emit(full, pb.EventType.CREATE)
            for name in dirnames:
                try:
                    self._add(posixpath.join(dirpath, name), _SUBDIR_MASK)
                except OSError:
                    # Gone already, or not a directory after all: nothing to follow there.
                    continue

    # -- draining --------------------------------------------------------------------------------

    def pump(self) -> None:
        """Move every event the kernel has queued into the pending list (never blocks)."""
        if self.error is not None or self._inotify.closed:
            return
        try:
            while True:
                raw = self._inotify.read(timeout=0)
                if not raw:
                    break
                for event in raw:
                    self._convert(event)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EBADF):
                self._fail(Internal(f"reading inotify events: {exc.strerror}"))
        finally:
            self._forget_moved_out()
            horizon = time.monotonic() - SYNTHESIZED_TTL_S
            for path in [p for p, at in self._synthesized.items() if at < horizon]:
                del self._synthesized[path]
        if len(self._pending) > MAX_PENDING_EVENTS:
            self._fail(Internal("too many undelivered watch events; recreate the watcher"))
        if self._pending or self.error is not None:
            self.changed.set()

    def take(self) -> list[pb.FilesystemEvent]:
        """Every pending event, oldest first, clearing the list (raises the watcher's error)."""
        if self.error is not None:
            raise self.error
        events, self._pending, self._last = self._pending, [], None
        self.changed.clear()
        return events

    def _convert(self, event: Any) -> None:
        wd: int = event.wd
        mask: int = event.mask
        cookie: int = event.cookie
        name: str = event.name
        if mask & flags.Q_OVERFLOW:
            self._fail(Internal("inotify event queue overflowed"))
            return
        base = self._paths.get(wd)
        if mask & flags.IGNORED:
            self._paths.pop(wd, None)
            return
        if base is None:
            return
        is_root = base == self.root
        if not name and not is_root:
            # A subdirectory's events about itself: its parent already reports them.
            return
        full = posixpath.join(base, name) if name else base
        reported = mask
        if reported & flags.CREATE and full in self._synthesized:
            del self._synthesized[full]
            reported &= ~flags.CREATE
        for bits, kind in _TYPES:
            if reported & bits:
                self._emit(full, kind)
        if self.recursive and mask & flags.ISDIR and name:
            self._follow_dir(mask, cookie, full)

    def _follow_dir(self, mask: int, cookie: int, full: str) -> None:
        """Keep recursive watches in step with directories created or moved in the tree."""
        if mask & flags.CREATE:
            self._add_tree_root(full, synthesize=True)
        elif mask & flags.MOVED_FROM:
            self._moved_dirs[cookie] = full
        elif mask & flags.MOVED_TO:
            old = self._moved_dirs.pop(cookie, None)
            if old is None:
                self._add_tree_root(full, synthesize=False)
            else:
                self._rename_prefix(old, full)

    def _add_tree_root(self, path: str, *, synthesize: bool) -> None:
        try:
            self._add(path, _SUBDIR_MASK)
        except OSError:
            return
        self._add_tree(path, synthesize=synthesize)

    def _rename_prefix(self, old: str, new: str) -> None:
        for wd, path in list(self._paths.items()):
            if path == old or path.startswith(old + "/"):
                self._paths[wd] = new + path[len(old):]

    def _forget_moved_out(self) -> None:
        """Directories moved out of the tree (no matching MOVED_TO) stop being watched."""
        for old in self._moved_dirs.values():
            for wd, path in list(self._paths.items()):
                if path == old or path.startswith(old + "/"):
                    self._paths.pop(wd, None)
                    try:
                        self._inotify.rm_watch(wd)
                    except OSError:
                        pass
        self._moved_dirs.clear()

    def _emit(self, full: str, kind: pb.EventType) -> None:
        name = posixpath.relpath(full, self.root) if full != self.root else "."
        if self._last == (name, kind):
            return
        self._last = (name, kind)
        entry = None
        if self.include_entry:
            try:
                entry = entry_info(full, NameCache())
            except AenvError:
                pass  # removed or renamed away: the event carries no entry
        self._pending.append(pb.FilesystemEvent(name=wire_str(name), type=kind, entry=entry))

    def _fail(self, error: AenvError) -> None:
        self.error = error
        self._pending = []
        self._stop_reading()
        self.changed.set()

    # -- teardown --------------------------------------------------------------------------------

    def _stop_reading(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._inotify.fileno())
        self._loop = None

    def close(self) -> None:
        if self._inotify.closed:
            return
        self._stop_reading()
        self._inotify.close()


def _watch_error(exc: OSError) -> AenvError:
    if exc.errno == errno.ENOSPC:
        return ResourceExhausted("inotify watch limit reached (fs.inotify.max_user_watches)")
    return Internal(f"cannot watch: {exc.strerror}")


class WatcherRegistry:
    """Every live watcher: polled ones by id, streaming ones until their stream ends."""

    def __init__(self) -> None:
        self._polled: dict[str, Watcher] = {}
        self._streams: set[Watcher] = set()

    async def open(self, root: str, *, recursive: bool, include_entry: bool) -> Watcher:
        """A started watcher for a ``WatchDir`` stream; the caller must :meth:`release` it."""
        watcher = Watcher(root, recursive=recursive, include_entry=include_entry)
        try:
            # A recursive walk of a big tree must not stall the loop.
            await asyncio.to_thread(watcher.add_initial_watches)
        except BaseException:
            watcher.close()
            raise
        watcher.start(asyncio.get_running_loop())
        self._streams.add(watcher)
        return watcher

    def release(self, watcher: Watcher) -> None:
        self._streams.discard(watcher)
        watcher.close()

    async def create(self, root: str, *, recursive: bool, include_entry: bool) -> str:
        watcher = await self.open(root, recursive=recursive, include_entry=include_entry)
        self._streams.discard(watcher)
        watcher_id = "w" + secrets.token_hex(8)
        self._polled[watcher_id] = watcher
        return watcher_id

    def events(self, watcher_id: str) -> list[pb.FilesystemEvent]:
        watcher = self._find(watcher_id)
        watcher.pump()
        return watcher.take()

    def remove(self, watcher_id: str) -> None:
        self._find(watcher_id)
        self._polled.pop(watcher_id).close()

    def pump_all(self) -> None:
        """Drain every watcher now, so new directories are watched before they are written to."""
        for watcher in self._all():
            watcher.pump()

    def close_all(self) -> None:
        for watcher in self._all():
            watcher.close()
        self._polled.clear()
        self._streams.clear()

    def _all(self) -> Iterable[Watcher]:
        return [*self._polled.values(), *self._streams]

    def _find(self, watcher_id: str) -> Watcher:
        watcher = self._polled.get(watcher_id)
        if watcher is None:
            raise NotFound(f"watcher with id {watcher_id} not found")
        return watcher
