"""envd's ASGI application: auth, CORS, and dispatch to the RPC services and HTTP routes."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from aenv.envd.filesystem.service import FilesystemService, end_watches_on_disconnect
from aenv.envd.filesystem.watch import WatcherRegistry
from aenv.envd.gen.filesystem_connect import FilesystemASGIApplication
from aenv.envd.gen.process_connect import ProcessASGIApplication
from aenv.envd.http_files import download
from aenv.envd.http_misc import envs, error_response, health, init, metrics, restored
from aenv.envd.http_upload import upload
from aenv.envd.process.manager import ProcessManager
from aenv.envd.process.service import ProcessService
from aenv.envd.rpc import ErrorMappingInterceptor, codecs
from aenv.envd.state import EnvdState
from aenv.envd.sudo_server import SudoServer

UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)

#: Requests that do not need ``X-Access-Token``: liveness (and its post-restore variant, which
#: only renews envd's epoll instance), and /files (which may be signed).
_OPEN = {
    ("GET", "/health"), ("POST", "/restored"), ("GET", "/files"), ("POST", "/files"),
    ("POST", "/init"),
}

#: Upper bound on a single unary RPC body; envd's messages are small.
RPC_READ_MAX_BYTES = 64 * 1024 * 1024


class EnvdApp:
    """Top-level dispatcher: cheaper than a router for the hot RPC paths."""

    def __init__(self, state: EnvdState, exec_helper: str | None = None) -> None:
        self.state = state
        self.processes = ProcessManager(exec_helper)
        self.sudo = SudoServer(exec_helper)
        self.watchers = WatcherRegistry()
        interceptors = [ErrorMappingInterceptor()]
        self.process_rpc = ProcessASGIApplication(
            ProcessService(state, self.processes),  # type: ignore[arg-type]
            interceptors=interceptors, read_max_bytes=RPC_READ_MAX_BYTES, codecs=codecs(),
        )
        self.filesystem_rpc = end_watches_on_disconnect(FilesystemASGIApplication(
            FilesystemService(state, self.watchers),  # type: ignore[arg-type]
            interceptors=interceptors, read_max_bytes=RPC_READ_MAX_BYTES, codecs=codecs(),
        ))
        self.http = Starlette(
            routes=[
                Route("/health", health, methods=["GET"]),
                Route("/restored", restored, methods=["POST"]),
                Route("/files", download, methods=["GET"]),
                Route("/files", upload, methods=["POST"]),
                Route("/init", init, methods=["POST"]),
                Route("/envs", envs, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
            ],
        )
        self.http.state.envd = state
        self.http.state.watchers = self.watchers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if (scope["method"], path) not in _OPEN and self.state.access_token is not None:
            token = _header(scope, b"x-access-token")
            if not self.state.token_matches(token):
                await error_response(401, UNAUTHORIZED)(scope, receive, send)
                return
        if path.startswith("/process.Process/"):
            await self.process_rpc(scope, receive, send)
        elif path.startswith("/filesystem.Filesystem/"):
            await self.filesystem_rpc(scope, receive, send)
        else:
            await self.http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.sudo.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.processes.kill_all()
                self.sudo.close()
                self.watchers.close_all()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def build_app(state: EnvdState | None = None, exec_helper: str | None = None) -> ASGIApp:
    core = EnvdApp(state or EnvdState(), exec_helper)
    app: Any = CORSMiddleware(
        core,
        allow_origins=["*"],
        allow_methods=["HEAD", "GET", "POST", "PUT", "PATCH", "DELETE"],
        allow_headers=["*"],
        expose_headers=[
            "Connect-Protocol-Version", "Connect-Timeout-Ms", "Grpc-Status", "Grpc-Message",
            "Location", "Content-Disposition",
        ],
    )
    app.envd = core
    return app  # type: ignore[no-any-return]
