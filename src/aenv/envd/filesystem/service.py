"""``filesystem.Filesystem``: the Connect-RPC service over the sandbox's files.

Every path is resolved for the request user (Basic header, else the default user) with
``users.resolve_path``, and every operation runs with that user's permissions
(:mod:`~aenv.envd.filesystem.creds`): what the kernel refuses them, symlinks included, is
``permission_denied``, and what they create is theirs. Semantics follow E2B's envd
(e2b-compat.md §4.3): Remove of a missing path succeeds, MakeDir of an existing directory is
``already_exists``, ListDir never follows symlinks below the listed directory.

Blocking work that grows with the tree (listing, recursive removal, cross-device moves) runs in
worker threads so one big directory cannot stall every other request. A WatchDir stream lives
until its Connect-Timeout or until its client disconnects (:func:`end_watches_on_disconnect`),
and gives its inotify instance back either way.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import shutil
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from connectrpc.errors import ConnectError
from protobuf import Oneof
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aenv.core.errors import AlreadyExists, InvalidArgument, NotFound
from aenv.envd.filesystem.creds import as_user
from aenv.envd.filesystem.entry import (
    NameCache,
    ensure_dirs,
    entry_from_stat,
    entry_info,
    forget_metadata,
    metadata_key,
    move_metadata,
    os_failure,
)
from aenv.envd.filesystem.watch import Watcher, WatcherRegistry
from aenv.envd.gen import filesystem_pb as pb
from aenv.envd.rpc import Ctx, keepalive_interval, request_user
from aenv.envd.state import EnvdState
from aenv.envd.users import User, resolve_path


def _oneof(case: str, value: Any) -> Any:
    """A oneof value (typed Any: protobuf-py's per-case Literal types defeat inference)."""
    return Oneof(case, value)


_KEEPALIVE = pb.WatchDirResponse(event=_oneof("keepalive", pb.WatchDirResponse.KeepAlive()))
_START = pb.WatchDirResponse(event=_oneof("start", pb.WatchDirResponse.StartEvent()))


#: The one streaming RPC: it idles between events, so only it needs disconnect handling.
WATCH_DIR_PATH = "/filesystem.Filesystem/WatchDir"


def end_watches_on_disconnect(app: ASGIApp) -> ASGIApp:
    """Wrap the Filesystem ASGI app so a WatchDir stream ends as soon as its client goes.

    connectrpc notices a disconnect only when the next message is sent, which for an idle watch
    is the next keepalive (50 s with the SDK); until then the watch would hold an inotify
    instance (128 per user by default). Cancelling the request task instead runs the stream's
    cleanup at once; connectrpc turns the cancellation into an ordinary end of the stream.
    """

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope.get("path") != WATCH_DIR_PATH or task is None:
            await app(scope, receive, send)
            return
        gone = False

        async def watched_receive() -> Message:
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect" and not task.done():
                gone = True
                task.cancel()
            return message

        try:
            await app(scope, watched_receive, send)
        except (asyncio.CancelledError, ConnectError):
            # connectrpc re-raises the cancellation as a CANCELED error once the stream has
            # been cleaned up; the client is gone, so there is nobody left to tell.
            if not gone:
                raise
        finally:
            if gone and task.cancelling():
                task.uncancel()

    return wrapped


class FilesystemService:
    def __init__(self, state: EnvdState, watchers: WatcherRegistry) -> None:
        self.state = state
        self.watchers = watchers

    def _resolve(self, ctx: Ctx, path: str) -> tuple[User, str]:
        user = request_user(ctx, self.state)
        return user, resolve_path(path, user, self.state.default_workdir)

    async def stat(self, request: pb.StatRequest, ctx: Ctx) -> pb.StatResponse:
        user, path = self._resolve(ctx, request.path)
        return pb.StatResponse(entry=await as_user(user, entry_info, path))

    async def make_dir(self, request: pb.MakeDirRequest, ctx: Ctx) -> pb.MakeDirResponse:
        user, path = self._resolve(ctx, request.path)
        await as_user(user, _make_dir, path, user)
        # Recursive watchers must watch the new directory before anything is written into it.
        self.watchers.pump_all()
        return pb.MakeDirResponse(entry=await as_user(user, entry_info, path))

    async def move(self, request: pb.MoveRequest, ctx: Ctx) -> pb.MoveResponse:
        user = request_user(ctx, self.state)
        source = resolve_path(request.source, user, self.state.default_workdir)
        destination = resolve_path(request.destination, user, self.state.default_workdir)
        await as_user(user, _move, source, destination, user)
        self.watchers.pump_all()
        return pb.MoveResponse(entry=await as_user(user, entry_info, destination))

    async def list_dir(self, request: pb.ListDirRequest, ctx: Ctx) -> pb.ListDirResponse:
        user, path = self._resolve(ctx, request.path)
        depth = request.depth or 1
        entries = await as_user(user, _list_tree, path, depth)
        return pb.ListDirResponse(entries=entries)

    async def remove(self, request: pb.RemoveRequest, ctx: Ctx) -> pb.RemoveResponse:
        if not request.path:
            # "" would mean the default workdir, i.e. the user's whole home: never by accident.
            raise InvalidArgument("path is required")
        user, path = self._resolve(ctx, request.path)
        await as_user(user, _remove_all, path)
        return pb.RemoveResponse()

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: Ctx
    ) -> AsyncIterator[pb.WatchDirResponse]:
        user, path = self._resolve(ctx, request.path)
        await as_user(user, _check_watchable, path)
        timeout_ms = ctx.timeout_ms
        deadline = None if timeout_ms is None else time.monotonic() + max(timeout_ms, 0) / 1000
        keepalive_s = keepalive_interval(ctx)
        watcher = await self.watchers.open(
            path, recursive=request.recursive, include_entry=request.include_entry
        )
        try:
            yield _START
            async for response in _watch_events(watcher, keepalive_s, deadline):
                yield response
        finally:
            self.watchers.release(watcher)

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: Ctx
    ) -> pb.CreateWatcherResponse:
        user, path = self._resolve(ctx, request.path)
        await as_user(user, _check_watchable, path)
        watcher_id = await self.watchers.create(
            path, recursive=request.recursive, include_entry=request.include_entry
        )
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: Ctx
    ) -> pb.GetWatcherEventsResponse:
        return pb.GetWatcherEventsResponse(events=self.watchers.events(request.watcher_id))

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: Ctx
    ) -> pb.RemoveWatcherResponse:
        self.watchers.remove(request.watcher_id)
        return pb.RemoveWatcherResponse()


def _already_exists(path: str) -> AlreadyExists:
    return AlreadyExists(f"directory already exists: {path}")


async def _watch_events(
    watcher: Watcher, keepalive_s: float, deadline: float | None
) -> AsyncIterator[pb.WatchDirResponse]:
    """Events as they come, a keepalive after ``keepalive_s`` of silence, until ``deadline``."""
    while True:
        wait = keepalive_s
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return  # the Connect-Timeout bounds the watch, like E2B's envd
            wait = min(wait, remaining)
        try:
            async with asyncio.timeout(wait):
                await watcher.changed.wait()
        except TimeoutError:
            if deadline is None or time.monotonic() < deadline:
                yield _KEEPALIVE
            continue
        for event in watcher.take():
            yield pb.WatchDirResponse(event=_oneof("filesystem", event))


def _check_watchable(path: str) -> None:
    """That the requesting user may read the directory (run as them; inotify itself is
    envd's).

    On failure: :class:`NotFound` for a missing path, :class:`InvalidArgument` for a non-dir,
    :class:`PermissionDenied` for one they may not read.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise os_failure(exc, f"path {path}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidArgument(f"path {path} is not a directory")
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError as exc:
        raise os_failure(exc, f"path {path}") from exc


def _make_dir(path: str, user: User) -> None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass  # ensure_dirs tells a missing path from one running through a file
    except OSError as exc:
        raise os_failure(exc, f"stat {path}") from exc
    else:
        if stat.S_ISDIR(st.st_mode):
            raise _already_exists(path)
        raise InvalidArgument(f"path already exists but it is not a directory: {path}")
    if not ensure_dirs(path, user.uid, user.gid):
        raise _already_exists(path)  # lost a race with another creator


def _move(source: str, destination: str, user: User) -> None:
    if not os.path.lexists(source):
        raise NotFound(f"source file not found: {source}")
    ensure_dirs(posixpath.dirname(destination), user.uid, user.gid)
    source_key = metadata_key(source)
    _rename(source, destination)
    move_metadata(source_key, metadata_key(destination))


def _rename(source: str, destination: str) -> None:
    try:
        Path(source).rename(destination)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # another mount (e.g. /tmp vs /home): copy instead
            raise os_failure(exc, f"moving {source} to {destination}") from exc
    try:
        shutil.move(source, destination)
    except OSError as exc:
        raise os_failure(exc, f"moving {source} to {destination}") from exc


def _list_tree(path: str, depth: int) -> list[pb.EntryInfo]:
    """Entries below ``path`` up to ``depth`` levels, depth-first in name order (like Go's
    ``filepath.WalkDir``), with paths under ``path`` as the caller spelled it."""
    try:
        resolved = os.path.realpath(path, strict=True)
        st = os.stat(resolved)
    except OSError as exc:
        raise os_failure(exc, f"directory {path}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidArgument(f"path is not a directory: {path}")
    names = NameCache()
    entries: list[pb.EntryInfo] = []

    def walk(real_dir: str, shown_dir: str, level: int) -> None:
        try:
            with os.scandir(real_dir) as it:
                children = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return  # removed while we were listing
        except OSError as exc:
            raise os_failure(exc, f"reading directory {shown_dir}") from exc
        for child in children:
            shown = posixpath.join(shown_dir, child.name)
            try:
                child_st = child.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries.append(entry_from_stat(shown, child_st, names, child.path))
            if level < depth and stat.S_ISDIR(child_st.st_mode):
                walk(child.path, shown, level + 1)

    walk(resolved, path, 1)
    return entries


def _remove_all(path: str) -> None:
    """``rm -rf``: a missing path is success; a symlink is removed, never its target."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise os_failure(exc, f"removing {path}") from exc
    key = metadata_key(path)
    try:
        if not stat.S_ISDIR(st.st_mode):
            Path(path).unlink()
        elif sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=_ignore_missing)
        else:
            shutil.rmtree(path, onerror=lambda f, p, info: _ignore_missing(f, p, info[1]))
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise os_failure(exc, f"removing {path}") from exc
    forget_metadata(key)


def _ignore_missing(func: object, path: str, exc: BaseException) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc
