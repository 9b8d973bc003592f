"""The node server process: locks, the running node (``compose/root.py``), the API and proxy
under uvicorn, signals.

``aenv server`` (and ``python -m aenv.server``) runs it. The node's locks come first (its home,
its network-slot range: a second node on either refuses to start, see core/locks.py), then the
API key and the node; SIGTERM or SIGINT stops serving (requests under way get
``shutdown_grace_s``, then their connections are closed) and closes the node. Shutdown leaves
sandboxes running: the next start re-attaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import uvicorn

from aenv.api.app import NodeApp, build_api
from aenv.compose.parts import api_key_for, console
from aenv.compose.root import running_node
from aenv.core import faults, log_setup, proc
from aenv.core.errors import FailedPrecondition
from aenv.core.locks import HeldLock, lock_home, lock_slot_range
from aenv.core.settings import Settings
from aenv.edge.limits import BodyLimits
from aenv.edge.protocol import ConnectionLimits, protocol_class
from aenv.proxy.app import Proxy
from aenv.runtime import reaper

log = logging.getLogger("aenv.server")

#: Threads of the event loop's default executor (``asyncio.to_thread``).
EXECUTOR_THREADS = 48


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT once it has shut down, which kills the process before
    our own clean-up (warm pool, network pool, store) runs. Stop serving, never re-raise.
    ``followers``: servers of the same app on other listeners, stopped with this one."""

    def __init__(self, config: uvicorn.Config, followers: list[uvicorn.Server]) -> None:
        super().__init__(config)
        self.followers = followers

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        for follower in self.followers:
            follower.should_exit = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


class _Follower(uvicorn.Server):
    """A server that leaves the signals to the one it follows."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def take_locks(settings: Settings) -> list[HeldLock]:
    """The home, then the slot range; held until the process exits (the kernel drops them
    however it exits). Raises ``FailedPrecondition`` naming the other node."""
    home = lock_home(settings.home)
    try:
        return [home, lock_slot_range(settings.net_first_index, settings.net_last_index)]
    except BaseException:
        home.release()
        raise


async def serve(settings: Settings) -> None:
    """Run the node until SIGTERM or SIGINT. Prerequisites: ``take_locks`` succeeded."""
    key = api_key_for(settings)
    # asyncio's default executor has cpu + 4 threads (6 here): a fork's 16 children queue
    # their clones, fsyncs and mount-record writes behind each other in it. The work is
    # waiting on disks and the kernel, not CPU, so more threads cost nothing.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=EXECUTOR_THREADS, thread_name_prefix="aenv-io"))
    async with running_node(settings) as node:
        proxy = Proxy(node)
        app = NodeApp(build_api(node, key), proxy, BodyLimits.of(settings))
        followers: list[uvicorn.Server] = []
        if settings.tls_listen:
            host, _, port = settings.tls_listen.rpartition(":")
            followers.append(_Follower(_config(
                app, settings, host or "0.0.0.0", int(port),
                ssl_certfile=str(settings.tls_cert_file),
                ssl_keyfile=str(settings.tls_key_file))))
        server = _Server(_config(app, settings, settings.host, settings.port), followers)
        _banner(settings, key)
        try:
            await asyncio.gather(server.serve(), *(f.serve() for f in followers))
        finally:
            await proxy.aclose()


def _banner(settings: Settings, key: str) -> None:
    """Where the node serves: for a person (text), or one log line (json: never the key)."""
    if settings.log_format == "json":
        logging.getLogger("aenv").info(
            "aenv serving on http://%s%s; the API key is in %s", settings.listen,
            f" and https://{settings.tls_listen}" if settings.tls_listen else "",
            "AENV_API_KEY" if settings.api_key else settings.home / "api_key")
        return
    console.print(f"[bold green]aenv[/] serving on http://{settings.listen}  "
                  f"(E2B_API_URL=E2B_SANDBOX_URL=http://{settings.listen})")
    if settings.tls_listen:
        console.print(f"and on https://{settings.tls_listen}")
    if not settings.api_key:
        console.print(f"API key: [bold]{key}[/] (stored in {settings.home / 'api_key'})")


def _config(app: NodeApp, settings: Settings, host: str, port: int, *,
            ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, loop="asyncio",
        # httptools, guarded: head size, header-read timeout, slow connections per client.
        http=protocol_class(ConnectionLimits.of(settings)),
        ws="websockets-sansio", lifespan="off", access_log=False, log_level=settings.log_level,
        log_config=None,  # uvicorn's own lines go through ours (log_format)
        timeout_keep_alive=settings.idle_timeout_s, server_header=False,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
    )


def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    log_setup.configure(settings.log_level, settings.log_format)
    # JSON logs are for a pipeline: no progress bars or banners between the objects.
    console.quiet = settings.log_format == "json"
    # One line per proxied request is noise at info level.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    faults.arm(settings.crash_at)
    # asyncio's own loop, not uvloop: every runtime, mount, ip and nft call is a subprocess, and
    # libuv spawns by fork(): 15 ms and 11 ms of CPU per spawn from this process, against 4 ms
    # and 3 ms with asyncio (subprocess's vfork). A resume hot is one spawn.
    try:
        locks = take_locks(settings)
    except FailedPrecondition as exc:
        # A second node on this home or these slots: one line, no traceback, exit status 1,
        # and nothing of the first node touched.
        raise SystemExit(f"aenv: {exc.message}") from None
    # The runtime's sandbox processes are re-parented to us, not to PID 1, and reaped as
    # soon as they exit (runtime/reaper.py): a kill no longer waits for a slow init.
    reaper.become_subreaper()
    proc.watch_children_by_pidfd()
    try:
        asyncio.run(serve(settings))
    finally:
        for lock in reversed(locks):
            lock.release()


if __name__ == "__main__":
    main()
