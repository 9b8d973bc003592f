"""Run envd's ASGI app under uvicorn."""

from __future__ import annotations

import asyncio
import logging
from types import FrameType

import uvicorn

from aenv.envd import orphans
from aenv.envd.app import build_app
from aenv.envd.eventloop import new_event_loop
from aenv.envd.state import EnvdState

#: E2B's envd closes idle keep-alive connections after 640 s; proxies keep streams longer.
IDLE_TIMEOUT_S = 640


class _Server(uvicorn.Server):
    """uvicorn's server without its 10 Hz tick.

    ``Server.main_loop`` sleeps 0.1 s at a time to look at ``should_exit`` and refresh the
    ``Date`` header (which envd does not send), so an idle envd woke the sandbox 10 times a
    second. Here it waits for the exit signal instead: idle means no wake-ups of ours.
    """

    _exit: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        orphans.watch(self._loop)
        if await self.on_tick(0):  # sets the default headers once; True if already exiting
            return
        while not self.should_exit:
            await self._exit.wait()
            self._exit.clear()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._exit is not None:
            # A signal handler runs between bytecodes of the loop's thread: hand over safely.
            self._loop.call_soon_threadsafe(self._exit.set)


def serve(
    host: str, port: int, state: EnvdState, *, exec_helper: str | None = None,
    log_level: str = "warning",
) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s envd %(levelname)s %(message)s"
    )
    config = uvicorn.Config(
        build_app(state, exec_helper),
        host=host,
        port=port,
        loop=f"{new_event_loop.__module__}:{new_event_loop.__name__}",  # see eventloop.py
        http="httptools",
        ws="none",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_keep_alive=IDLE_TIMEOUT_S,
        server_header=False,
        date_header=False,
    )
    server = _Server(config)
    server.run()
