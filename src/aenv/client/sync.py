"""``Client``: the async client for code without an event loop (threads, Ray actors, scripts).

A facade, not a second implementation: each call is the :class:`~aenv.client.AsyncClient`
coroutine of the same name, run on one private event loop in a daemon thread that the facade
owns (``asyncio.run_coroutine_threadsafe``). The async client and the e2b SDK objects under it
live and die on that loop, so their connection pools are never shared across loops, and any
number of threads may call one ``Client`` at once. ``close()`` (or the ``with`` exit) kills the
run's sandboxes, like the async client's, then stops the thread.

Signal handlers for the run cleanup are installed from the thread that makes the ``Client``
(the main thread, usually), since the loop thread cannot install them.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from e2b import AsyncSandbox

from aenv.client import runs
from aenv.client.client import AsyncClient, SandboxInfo, SnapshotInfo
from aenv.client.errors import ClientError, UsageError
from aenv.client.sandbox import COMMAND_TIMEOUT_S, CommandResult, State
from aenv.client.sandbox import Sandbox as AsyncSandboxHandle

T = TypeVar("T")


class _Loop:
    """One event loop running for ever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="aenv-client",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise UsageError("a sync aenv.client call from inside its own event loop")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl-C in the caller: do not leave the call running
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        if not self.thread.is_alive():
            self.loop.close()


class Sandbox:
    """The sync face of :class:`aenv.client.Sandbox`; ``with`` kills it at the end."""

    def __init__(self, loop: _Loop, handle: AsyncSandboxHandle) -> None:
        self._loop = loop
        self.handle = handle

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    @property
    def sandbox_id(self) -> str:
        return self.handle.sandbox_id

    @property
    def sdk(self) -> AsyncSandbox:
        """The e2b ``AsyncSandbox``: only usable on the client's loop (``Client.run_async``)."""
        return self.handle.sdk

    def run(self, cmd: str, *, timeout: float | None = COMMAND_TIMEOUT_S,
            envs: Mapping[str, str] | None = None, cwd: str | None = None,
            user: str | None = None, stdin: str | bytes | None = None,
            check: bool = False) -> CommandResult:
        return self._loop.run(self.handle.run(cmd, timeout=timeout, envs=envs, cwd=cwd,
                                              user=user, stdin=stdin, check=check))

    def write_file(self, path: str, data: str | bytes, *, user: str | None = None) -> None:
        self._loop.run(self.handle.write_file(path, data, user=user))

    def read_file(self, path: str, *, user: str | None = None) -> str:
        return self._loop.run(self.handle.read_file(path, user=user))

    def read_bytes(self, path: str, *, user: str | None = None) -> bytes:
        return self._loop.run(self.handle.read_bytes(path, user=user))

    def kill(self) -> bool:
        return self._loop.run(self.handle.kill())

    def pause(self, *, memory: bool = True) -> None:
        self._loop.run(self.handle.pause(memory=memory))

    def resume(self, *, timeout: int | None = None) -> Sandbox:
        self._loop.run(self.handle.resume(timeout=timeout))
        return self

    def set_timeout(self, seconds: int) -> None:
        self._loop.run(self.handle.set_timeout(seconds))

    def fork(self, count: int, *, timeout: int | None = None) -> Forked:
        return _forked(self._loop, self._loop.run(self.handle.fork(count, timeout=timeout)))

    def snapshot(self, name: str | None = None) -> SnapshotInfo:
        return self._loop.run(self.handle.snapshot(name))

    def info(self) -> SandboxInfo:
        return self._loop.run(self.handle.info())


class Forked(builtins.list[Sandbox]):
    """The children a fork started; ``errors`` holds one error per child that did not."""

    def __init__(self, children: builtins.list[Sandbox],
                 errors: builtins.list[ClientError]) -> None:
        super().__init__(children)
        self.errors = errors


def _forked(loop: _Loop, forked: builtins.list[AsyncSandboxHandle]) -> Forked:
    return Forked([Sandbox(loop, h) for h in forked], list(getattr(forked, "errors", [])))


class Client:
    """The sync face of :class:`aenv.client.AsyncClient`; takes the same arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = _Loop()
        try:
            # Made on the loop: its semaphore and connections belong there.
            self.aio: AsyncClient = self._loop.run(_make(*args, **kwargs))
        except BaseException:
            self._loop.stop()
            raise
        if self.aio.cleanup:
            runs.install_signal_handlers()  # from the caller's thread: the loop's cannot

    def __repr__(self) -> str:
        return f"sync.Client({self.aio.config.api_url!r}, run_id={self.run_id!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def run_id(self) -> str:
        return self.aio.run_id

    def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of one's own on the client's loop (e.g. over ``Sandbox.sdk``)."""
        return self._loop.run(coro)

    def close(self) -> None:
        if not self._loop.thread.is_alive():
            return
        try:
            self._loop.run(self.aio.aclose())
        finally:
            self._loop.stop()

    def create(self, template: str = "base", *, timeout: int | None = None,
               metadata: Mapping[str, str] | None = None,
               envs: Mapping[str, str] | None = None, idempotency_key: str | None = None,
               auto_pause: bool | None = None, allow_internet_access: bool | None = None
               ) -> Sandbox:
        return Sandbox(self._loop, self._loop.run(self.aio.create(
            template, timeout=timeout, metadata=metadata, envs=envs,
            idempotency_key=idempotency_key, auto_pause=auto_pause,
            allow_internet_access=allow_internet_access)))

    def connect(self, sandbox_id: str, *, timeout: int | None = None) -> Sandbox:
        return Sandbox(self._loop, self._loop.run(self.aio.connect(sandbox_id, timeout=timeout)))

    def resume(self, sandbox_id: str, *, timeout: int | None = None) -> Sandbox:
        return Sandbox(self._loop, self._loop.run(self.aio.resume(sandbox_id, timeout=timeout)))

    def fork(self, sandbox_id: str, count: int, *, timeout: int | None = None) -> Forked:
        return _forked(self._loop, self._loop.run(self.aio.fork(sandbox_id, count,
                                                                timeout=timeout)))

    def info(self, sandbox_id: str) -> SandboxInfo:
        return self._loop.run(self.aio.info(sandbox_id))

    def list(self, *, metadata: Mapping[str, str] | None = None,
             state: State | builtins.list[State] | None = None) -> builtins.list[SandboxInfo]:
        return self._loop.run(self.aio.list(metadata=metadata, state=state))

    def kill(self, sandbox_id: str) -> bool:
        return self._loop.run(self.aio.kill(sandbox_id))

    def kill_by_metadata(self, **labels: str) -> builtins.list[str]:
        return self._loop.run(self.aio.kill_by_metadata(**labels))

    def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        self._loop.run(self.aio.pause(sandbox_id, memory=memory))

    def set_timeout(self, sandbox_id: str, seconds: int) -> None:
        self._loop.run(self.aio.set_timeout(sandbox_id, seconds))

    def snapshot(self, sandbox_id: str, *, name: str | None = None) -> SnapshotInfo:
        return self._loop.run(self.aio.snapshot(sandbox_id, name=name))

    def list_snapshots(self, *, sandbox_id: str | None = None) -> builtins.list[SnapshotInfo]:
        return self._loop.run(self.aio.list_snapshots(sandbox_id=sandbox_id))

    def delete_snapshot(self, snapshot_id: str) -> bool:
        return self._loop.run(self.aio.delete_snapshot(snapshot_id))


async def _make(*args: Any, **kwargs: Any) -> AsyncClient:
    return AsyncClient(*args, **kwargs)
