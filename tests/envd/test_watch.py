"""Directory watching: the sync SDK's polled watchers and the async SDK's WatchDir stream.

The sync SDK reads events right after a write returns and expects them to be there already
(``test_watch_directory_changes`` in E2B's suite asserts exactly CREATE, CHMOD, WRITE), so these
tests never sleep before polling. Recursive watches must follow directories created after the
watch started, and a watch must give its inotify instance back when it ends.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    Sandbox,
    SandboxException,
)

from tests.envd.connect_wire import END_STREAM, STREAM_HEADERS, envelope, parse_envelopes
from tests.envd.harness import EnvdSandbox

CREATE, WRITE = FilesystemEventType.CREATE, FilesystemEventType.WRITE
CHMOD, REMOVE = FilesystemEventType.CHMOD, FilesystemEventType.REMOVE
RENAME = FilesystemEventType.RENAME


def _pairs(events: list[FilesystemEvent]) -> list[tuple[str, FilesystemEventType]]:
    return [(e.name, e.type) for e in events]


def _inotify_instances(envd: EnvdSandbox) -> int:
    """inotify descriptors held by the envd process tree (bwrap and its children)."""
    count = 0
    for pid in _descendants(envd.process.pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
            except OSError:
                continue
    return count


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


# -- sync SDK: CreateWatcher / GetWatcherEvents / RemoveWatcher --------------------------------


def test_write_events_are_there_immediately(sandbox: Sandbox, workdir: str) -> None:
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/w.txt", "This file will be watched.")
        assert _pairs(handle.get_new_events()) == [
            ("w.txt", CREATE), ("w.txt", CHMOD), ("w.txt", WRITE),
        ]
        assert handle.get_new_events() == []  # returned events are cleared
        sandbox.files.write(f"{workdir}/w.txt", "This file has been modified.")
        assert ("w.txt", WRITE) in _pairs(handle.get_new_events())
    finally:
        handle.stop()
    with pytest.raises(SandboxException, match="already stopped"):
        handle.get_new_events()


def test_large_write_is_one_write_event(sandbox: Sandbox, workdir: str) -> None:
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/big.bin", iter([os.urandom(1 << 20)] * 8))
        assert _pairs(handle.get_new_events()) == [
            ("big.bin", CREATE), ("big.bin", CHMOD), ("big.bin", WRITE),
        ]
    finally:
        handle.stop()


def test_rename_remove_and_chmod_events(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.write(f"{workdir}/a.txt", "a")
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.rename(f"{workdir}/a.txt", f"{workdir}/b.txt")
        sandbox.commands.run(f"chmod 600 {workdir}/b.txt")
        sandbox.files.remove(f"{workdir}/b.txt")
        assert _pairs(handle.get_new_events()) == [
            ("a.txt", RENAME), ("b.txt", CREATE), ("b.txt", CHMOD), ("b.txt", REMOVE),
        ]
    finally:
        handle.stop()


def test_non_recursive_ignores_subdirectories(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/sub")
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/sub/inner.txt", "x")
        assert handle.get_new_events() == []
    finally:
        handle.stop()


def test_recursive_watch(sandbox: Sandbox, workdir: str) -> None:
    sandbox.files.make_dir(f"{workdir}/nested")
    handle = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sandbox.files.write(f"{workdir}/nested/f.txt", "x")
        assert _pairs(handle.get_new_events()) == [
            ("nested/f.txt", CREATE), ("nested/f.txt", CHMOD), ("nested/f.txt", WRITE),
        ]
    finally:
        handle.stop()


def test_recursive_watch_follows_new_directories(sandbox: Sandbox, workdir: str) -> None:
    handle = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sandbox.files.make_dir(f"{workdir}/later")
        sandbox.files.write(f"{workdir}/later/f.txt", "x")
        # The upload itself creates both directories, then the file inside them.
        sandbox.files.write(f"{workdir}/up/deep/g.txt", "y")
        # And a process creates a tree faster than any watch could be added by hand.
        sandbox.commands.run(f"mkdir -p {workdir}/sh/a/b && echo z > {workdir}/sh/a/b/h.txt")
        events = _pairs(handle.get_new_events())
    finally:
        handle.stop()
    for expected in [("later", CREATE), ("later/f.txt", WRITE), ("up", CREATE),
                     ("up/deep", CREATE), ("up/deep/g.txt", CREATE), ("up/deep/g.txt", WRITE),
                     ("sh/a/b", CREATE), ("sh/a/b/h.txt", CREATE)]:
        assert expected in events, (expected, events)
    assert events.count(("sh/a/b/h.txt", CREATE)) == 1


def test_include_entry(sandbox: Sandbox, workdir: str) -> None:
    handle = sandbox.files.watch_dir(workdir, include_entry=True)
    try:
        sandbox.files.write(f"{workdir}/e.txt", "entry")
        sandbox.files.remove(f"{workdir}/e.txt")
        events = handle.get_new_events()
    finally:
        handle.stop()
    created = events[0]
    assert (created.name, created.type) == ("e.txt", CREATE)
    assert created.entry is not None
    assert (created.entry.path, created.entry.type) == (f"{workdir}/e.txt", FileType.FILE)
    assert events[-1].type == REMOVE and events[-1].entry is None


def test_watch_missing_directory_or_file(sandbox: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir(f"{workdir}/missing")
    sandbox.files.write(f"{workdir}/file.txt", "x")
    with pytest.raises(SandboxException):
        sandbox.files.watch_dir(f"{workdir}/file.txt")


def test_stopped_watchers_release_inotify(
    sandbox: Sandbox, workdir: str, envd: EnvdSandbox
) -> None:
    before = _inotify_instances(envd)
    handles = [sandbox.files.watch_dir(workdir, recursive=True) for _ in range(3)]
    assert _inotify_instances(envd) == before + 3
    for handle in handles:
        handle.stop()
    assert _inotify_instances(envd) == before


# -- async SDK: the WatchDir stream --------------------------------------------------------------


class _Received:
    """The async SDK's ``on_event`` target: collects events and wakes whoever waits on them."""

    def __init__(self) -> None:
        self.events: list[FilesystemEvent] = []
        self._changed = asyncio.Event()

    def append(self, event: FilesystemEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, wanted: tuple[str, FilesystemEventType]) -> None:
        async with asyncio.timeout(5):
            while wanted not in _pairs(self.events):
                self._changed.clear()
                await self._changed.wait()


@pytest.mark.anyio
async def test_async_watch(async_sandbox: AsyncSandbox, workdir: str, envd: EnvdSandbox) -> None:
    before = _inotify_instances(envd)
    received = _Received()
    handle = await async_sandbox.files.watch_dir(workdir, on_event=received.append)
    try:
        assert _inotify_instances(envd) == before + 1
        await async_sandbox.files.write(f"{workdir}/s.txt", "streamed")
        await received.wait_for(("s.txt", WRITE))
        assert _pairs(received.events)[:3] == [
            ("s.txt", CREATE), ("s.txt", CHMOD), ("s.txt", WRITE),
        ]
    finally:
        await handle.stop()
    # The stream ends as soon as the client disconnects, not at the next keepalive (50 s).
    for _ in range(60):  # another process's descriptors: nothing to wait on but time
        if _inotify_instances(envd) == before:
            break
        await asyncio.sleep(0.05)
    assert _inotify_instances(envd) == before


@pytest.mark.anyio
async def test_async_recursive_watch_with_entries(
    async_sandbox: AsyncSandbox, workdir: str
) -> None:
    received = _Received()
    exits: list[Exception | None] = []
    handle = await async_sandbox.files.watch_dir(
        workdir, on_event=received.append, on_exit=exits.append, recursive=True,
        include_entry=True,
    )
    try:
        await async_sandbox.files.make_dir(f"{workdir}/n")
        await async_sandbox.files.write(f"{workdir}/n/t.txt", "t")
        await received.wait_for(("n/t.txt", WRITE))
        entry = next(e.entry for e in received.events if e.name == "n/t.txt")
        assert entry is not None and entry.path == f"{workdir}/n/t.txt"
    finally:
        await handle.stop()
    assert exits == [None]


@pytest.mark.anyio
async def test_async_watch_missing_directory(async_sandbox: AsyncSandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.watch_dir(f"{workdir}/missing", on_event=lambda e: None)


def test_watch_stream_keepalive_and_timeout(workdir: str, envd: EnvdSandbox) -> None:
    """Raw WatchDir: start first, keepalives during silence, a clean end at Connect-Timeout-Ms."""
    before = _inotify_instances(envd)
    start = time.monotonic()
    response = httpx.post(
        f"{envd.url}/filesystem.Filesystem/WatchDir", content=envelope({"path": workdir}),
        headers={**STREAM_HEADERS, "connect-timeout-ms": "1200",
                 "keepalive-ping-interval": "0.3"},
        timeout=10,
    )
    elapsed = time.monotonic() - start
    frames = parse_envelopes(response.content)
    assert frames[0] == (0, {"start": {}})
    assert frames[-1] == (END_STREAM, {})
    keepalives = [m for flags, m in frames if m == {"keepalive": {}}]
    assert len(keepalives) >= 2
    assert 1.0 < elapsed < 5
    assert _inotify_instances(envd) == before


def test_watch_stream_errors_go_in_the_end_frame(workdir: str, envd: EnvdSandbox) -> None:
    response = httpx.post(
        f"{envd.url}/filesystem.Filesystem/WatchDir",
        content=envelope({"path": f"{workdir}/missing"}), headers=STREAM_HEADERS, timeout=10,
    )
    assert response.status_code == 200
    [(flags, end)] = parse_envelopes(response.content)
    assert flags == END_STREAM and end["error"]["code"] == "not_found"
