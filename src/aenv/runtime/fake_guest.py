"""The guest of a fake sandbox: envd's control endpoints, where a real guest's envd listens.

A node waits for envd in every sandbox it starts (``GET /health``, ``POST /restored`` after a
restore, ``POST /init`` with the access token), probes it while the sandbox runs, samples
``/metrics``, and runs the template image's warm-up command through
``process.Process/Start``. ``FakeGuest`` answers those on ``slot.guest_ip:ENVD_PORT`` *inside
the slot's network namespace*, so the node reaches it exactly as it reaches a real guest:
through the slot's host veth (``network/guest_http.py``), nft zones and all.

How: a thread of its own enters the netns (``setns``; a thread's network namespace is its own,
and this thread ends right after), creates the listening socket there, and hands it back; a
socket stays in the namespace it was made in, so the node's event loop serves it like any
other. No process is started, nothing outlives ``stop`` (or the node: the kernel closes the
socket), and the slot is left as it was made. Only root may enter a netns.

What the guest keeps — access token, env vars, default user and workdir, boot id — lives in
the fake sandbox's memory dict under ``envd:`` keys, so a checkpoint saves it and a restore
brings it back as runsc would: a restored guest answers ``/restored`` and ``/init`` as a
freshly booted one does, and honours the token its image holds (as envd's ``/init``).

Honest about what it is not: no command runs here. ``Process/Start`` reports a process that
ended at once with status 127 and says why on stderr (the template warm-up ignores exit codes;
a user's ``commands.run`` raises); every other process or filesystem RPC is ``unimplemented``,
``/files`` is 501, anything else 404, in envd's error shapes. A frozen guest (``freeze``)
accepts connections but answers nothing until ``thaw``, as a paused sentry.

Owns: its listening socket and the connections it accepted. Must not touch: the slot (no
address, link or route changes), anything outside the node process.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import http
import itertools
import json
import os
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aenv.core.errors import RuntimeFailure
from aenv.core.net import NetSlot
from aenv.runtime.base import ENVD_PORT

#: The keys of the sandbox's memory dict that hold envd's state.
TOKEN, ENV_VARS, USER, WORKDIR, BOOT_ID = (
    "envd:access_token", "envd:env_vars", "envd:default_user", "envd:default_workdir",
    "envd:boot_id")
#: The exit status a shell gives a command it cannot run: none runs in a fake sandbox.
NO_COMMAND_STATUS = 127
NO_COMMAND = "the fake runtime runs no commands: its sandboxes have only envd's control API\n"
#: Requests larger than envd's would be (its RPC cap is 64 MiB, but the node's own calls are
#: bytes): refused with 413 and the connection closed, unread.
MAX_BODY = 4 << 20
#: Headers beyond this are no request of the node's (asyncio's default stream limit).
MAX_HEAD = 64 * 1024
#: Paths envd serves without ``X-Access-Token`` (envd/app.py's ``_OPEN``).
_OPEN = {("GET", "/health"), ("POST", "/restored"), ("GET", "/files"), ("POST", "/files"),
         ("POST", "/init")}
_UNAUTHORIZED = ("unauthorized access, please provide a valid access token or method signing "
                 "if supported")
_CLONE_NEWNET = 0x40000000
_END_STREAM = 0x02


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    close: bool


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class FakeGuest:
    """envd's control endpoints for one fake sandbox (see the module docstring).

    ``memory`` is the sandbox's memory dict (read and written in place); ``metrics`` gives
    what ``/metrics`` reports.
    """

    def __init__(self, memory: dict[str, str],
                 metrics: Callable[[], Mapping[str, int | float]]) -> None:
        self._memory = memory
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._running = asyncio.Event()
        self._running.set()
        self._stopped = False
        self._pids = itertools.count(1000)

    async def start(self, slot: NetSlot, *, fresh: bool) -> None:
        """Listen on ``slot.guest_ip:ENVD_PORT`` in the slot's netns. ``fresh``: a boot, so
        envd makes a boot id (a restore keeps the one in its memory).

        Prerequisites: the slot's netns exists and holds the guest address; root.
        On failure: ``RuntimeFailure``; nothing listens.
        """
        if fresh:
            self._memory[BOOT_ID] = str(uuid.uuid4())
        try:
            sock = await _listening_socket(slot.netns_path, (slot.guest_ip, ENVD_PORT))
        except OSError as exc:
            raise RuntimeFailure(f"the fake guest cannot listen in slot {slot.index} "
                                 f"({slot.netns_path}): {exc}") from exc
        try:
            self._server = await asyncio.start_server(self._serve, sock=sock, limit=MAX_HEAD)
        except BaseException:
            sock.close()
            raise

    def freeze(self) -> None:
        """Answer nothing until ``thaw`` (connections are still accepted)."""
        self._running.clear()

    def thaw(self) -> None:
        self._running.set()

    def reset(self) -> None:
        """Drop every connection open now, as a checkpoint resets the guest's endpoints (their
        handlers read the end of the stream and return; a frozen one's once thawed)."""
        for writer in list(self._connections):
            writer.transport.abort()

    def stop(self) -> None:
        """Stop listening and drop every connection. Idempotent."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
            self._server = None
        self.reset()
        self._running.set()  # handlers waiting out a freeze end now

    # ---------------------------------------------------------------- HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                await self._running.wait()
                if self._stopped:  # also one accepted just before the guest stopped
                    return
                try:
                    request = await _read_request(reader)
                except _BadRequest as exc:
                    writer.write(_encode(_error(exc.status, str(exc)), close=True))
                    await writer.drain()
                    return
                if request is None:
                    return
                await self._running.wait()
                if self._stopped:
                    return
                writer.write(_encode(self._answer(request), close=request.close))
                await writer.drain()
                if request.close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the node went away mid-request: nothing to answer
        except asyncio.CancelledError:
            # Only the loop's shutdown cancels a handler (nobody awaits it). Python 3.11's
            # stream server logs a handler that ends cancelled as an unhandled error (3.12
            # checks ``task.cancelled()`` first): end it as a closed connection instead.
            return
        finally:
            self._connections.discard(writer)
            writer.close()

    def _answer(self, request: _Request) -> _Response:
        route = (request.method, request.path)
        token = self._memory.get(TOKEN)
        if route not in _OPEN and token and request.headers.get("x-access-token") != token:
            return _error(401, _UNAUTHORIZED)
        if route in (("GET", "/health"), ("POST", "/restored")):
            return _Response(204)
        if route == ("POST", "/init"):
            return self._init(request)
        if route == ("GET", "/envs"):
            return _json(200, json.loads(self._memory.get(ENV_VARS, "{}")))
        if route == ("GET", "/metrics"):
            return _json(200, dict(self._metrics()))
        if request.path == "/files":
            return _error(501, "the fake runtime's sandboxes have no files to serve")
        if request.path == "/process.Process/Start":
            return self._no_command(request)
        if request.path.startswith(("/process.Process/", "/filesystem.Filesystem/")):
            return _unimplemented(request, f"{request.path} is not served by the fake runtime")
        return _error(404, f"{request.path} not found")

    def _init(self, request: _Request) -> _Response:
        """envd's ``/init`` (envd/http_misc.py): the same checks, kept in memory."""
        try:
            body = json.loads(request.body or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            env_vars = body.get("envVars") or {}
            if not isinstance(env_vars, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
                raise ValueError("envVars must be an object of strings")
            fields = {name: body.get(name)
                      for name in ("accessToken", "defaultUser", "defaultWorkdir")}
            if any(v is not None and not isinstance(v, str) for v in fields.values()):
                raise ValueError("accessToken, defaultUser and defaultWorkdir are strings")
            if not isinstance(body.get("renewBootId", False), bool):
                raise ValueError("renewBootId must be a boolean")
        except ValueError as exc:
            return _error(400, f"invalid init request: {exc}")
        current = self._memory.get(TOKEN)
        new = fields["accessToken"]
        # Once a token is set, only its holder may change the sandbox's identity.
        if current and request.headers.get("x-access-token") != current and new != current:
            return _error(401, _UNAUTHORIZED)
        if new is not None:
            self._memory[TOKEN] = new
        if env_vars:
            self._memory[ENV_VARS] = json.dumps(
                {**json.loads(self._memory.get(ENV_VARS, "{}")), **env_vars}, sort_keys=True)
        for name, key in (("defaultUser", USER), ("defaultWorkdir", WORKDIR)):
            if fields[name]:
                self._memory[key] = str(fields[name])
        if body.get("renewBootId"):
            self._memory[BOOT_ID] = str(uuid.uuid4())
        return _Response(204)

    def _no_command(self, request: _Request) -> _Response:
        """A ``Start`` stream as envd sends it for a command that could not run."""
        if not request.headers.get("content-type", "").startswith("application/connect+json"):
            return _unimplemented(request, "the fake runtime speaks Connect's JSON only")
        events: list[dict[str, Any]] = [
            {"event": {"start": {"pid": next(self._pids)}}},
            {"event": {"data": {"stderr": base64.b64encode(NO_COMMAND.encode()).decode()}}},
            {"event": {"end": {"exitCode": NO_COMMAND_STATUS, "exited": True,
                               "status": f"exit status {NO_COMMAND_STATUS}"}}},
        ]
        body = b"".join(_envelope(0, e) for e in events) + _envelope(_END_STREAM, {})
        return _Response(200, body, "application/connect+json")


# -------------------------------------------------------------------- wire helpers


def _error(status: int, message: str) -> _Response:
    """envd's error body: the status repeated as ``code``."""
    return _json(status, {"code": status, "message": message})


def _json(status: int, value: object) -> _Response:
    return _Response(status, json.dumps(value).encode())


def _unimplemented(request: _Request, message: str) -> _Response:
    """Connect's ``unimplemented``: in the end-of-stream message of a streaming call (HTTP
    200), as a JSON body with HTTP 501 of a unary one."""
    error = {"code": "unimplemented", "message": message}
    if request.headers.get("content-type", "").startswith("application/connect+"):
        return _Response(200, _envelope(_END_STREAM, {"error": error}),
                         "application/connect+json")
    return _json(501, error)


def _envelope(flags: int, message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def _encode(response: _Response, *, close: bool) -> bytes:
    status = http.HTTPStatus(response.status)
    head = [f"HTTP/1.1 {status.value} {status.phrase}"]
    if response.status != 204:  # a 204 has no body, and says nothing of its length
        head += [f"content-type: {response.content_type}",
                 f"content-length: {len(response.body)}"]
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on a kept-alive connection; None once the node closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest(400, "the request ended inside its head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest(431, "request head too large") from exc
    request_line, *lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = request_line.split(" ")
    except ValueError as exc:
        raise _BadRequest(400, f"bad request line {request_line[:100]!r}") from exc
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest(400, "bad content-length") from exc
        if not 0 <= length <= MAX_BODY:
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        body = await reader.readexactly(length)
    return _Request(method, target.split("?", 1)[0], headers, body, close)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise _BadRequest(400, "bad chunk size") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers: none of the node's requests has any worth reading
            return bytes(body)
        if len(body) + size > MAX_BODY:
            raise _BadRequest(413, f"request body over {MAX_BODY} bytes")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


# -------------------------------------------------------------------- the netns


async def _listening_socket(netns_path: str, address: tuple[str, int]) -> socket.socket:
    """A listening, non-blocking TCP socket on ``address`` inside the network namespace at
    ``netns_path``, made by a thread that enters it and ends (never a pool's thread: it
    would stay in that namespace for whatever it runs next)."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[socket.socket] = loop.create_future()

    def settle(sock: socket.socket | None, exc: BaseException | None) -> None:
        if made.done():  # the caller was cancelled meanwhile: nobody takes the socket
            if sock is not None:
                sock.close()
        elif exc is not None:
            made.set_exception(exc)
        else:
            made.set_result(sock)  # type: ignore[arg-type]

    def enter_and_listen() -> None:
        try:
            sock = _listen_in(netns_path, address)
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, sock, None)

    threading.Thread(target=enter_and_listen, name="aenv-fake-guest", daemon=True).start()
    return await made


def _listen_in(netns_path: str, address: tuple[str, int]) -> socket.socket:
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` (``os.setns`` from 3.12)."""
    setns = getattr(os, "setns", None)
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
