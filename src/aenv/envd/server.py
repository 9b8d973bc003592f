"""Run envd's ASGI app under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from aenv.envd.app import build_app
from aenv.envd.eventloop import new_event_loop
from aenv.envd.state import EnvdState

#: E2B's envd closes idle keep-alive connections after 640 s; proxies keep streams longer.
IDLE_TIMEOUT_S = 640


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
    server = uvicorn.Server(config)
    server.run()
