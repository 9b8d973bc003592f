"""runsc's per-sandbox control socket: one urpc call, a JSON request and a JSON reply.

Every runsc sandbox serves urpc on ``<runsc --root>/runsc-<sandbox id>.sock`` (a Unix stream
socket); the CLI talks to it too, after ~20 ms of starting a Go binary and loading its state
file. Called directly, ``containerManager.Pause`` / ``Resume`` take well under a millisecond.
What the CLI also does and a direct call does not: update runsc's state file, so the caller
owns the truth about what it changed (see ``GvisorRuntime.freeze``).

The reply is ``{"success": bool, "err": str, "result": ...}``. Calls that take files (a
checkpoint's image files) pass their descriptors as ``SCM_RIGHTS`` with the request's bytes:
the sandbox reads them with the first message.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aenv.core.errors import InDoubt, NotFound, RuntimeFailure

#: A control call answers in well under a millisecond; seconds mean the sandbox is in trouble.
CALL_TIMEOUT_S = 10.0
_MAX_REPLY = 1 << 20


class CallFailed(RuntimeFailure):
    """The sandbox answered, and refused: nothing was changed."""


class CallInDoubt(InDoubt):
    """No answer (timeout, dropped connection): the call may or may not have taken effect."""


async def call(socket_path: Path, method: str, arg: Any = None, *,
               files: Sequence[int] = (), timeout: float = CALL_TIMEOUT_S) -> Any:
    """Send ``method(arg)``, with the open descriptors ``files`` (the caller keeps and closes
    them), and return its result.

    Raises ``NotFound`` when nothing listens on the socket (the sandbox is gone; nothing was
    sent), ``CallFailed`` when the sandbox answered with an error, ``CallInDoubt`` when the
    request was sent but no complete answer came back.
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        try:
            async with asyncio.timeout(timeout):
                await loop.sock_connect(sock, str(socket_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NotFound(f"no runsc control socket at {socket_path}") from exc
        except (OSError, TimeoutError) as exc:
            raise RuntimeFailure(
                f"cannot reach runsc control socket {socket_path}: {exc!r}") from exc
        request = json.dumps({"method": method, "arg": arg}).encode()
        try:
            # A request is a few hundred bytes: the first sendmsg takes it whole (or fails).
            sent = socket.send_fds(sock, [request], list(files)) if files else 0
            if sent < len(request):
                # Not an empty send once all went with the descriptors: a sandbox that has
                # answered and closed already would make even that fail with EPIPE.
                await loop.sock_sendall(sock, request[sent:])
            async with asyncio.timeout(timeout):
                reply = await _read_reply(lambda: loop.sock_recv(sock, 65536))
        except (OSError, TimeoutError, ValueError) as exc:
            raise CallInDoubt(f"{method} on {socket_path.name}: no answer ({exc!r})") from exc
    finally:
        sock.close()
    if not reply.get("success"):
        raise CallFailed(f"{method} on {socket_path.name}: {reply.get('err') or reply}")
    return reply.get("result")


async def _read_reply(read: Callable[[], Awaitable[bytes]]) -> dict[str, Any]:
    """urpc frames nothing: a reply ends where its JSON object does."""
    decoder = json.JSONDecoder()
    buffer = b""
    while len(buffer) < _MAX_REPLY:
        chunk = await read()
        if not chunk:
            break
        buffer += chunk
        try:
            reply, _ = decoder.raw_decode(buffer.decode())
        except ValueError:
            continue  # not all of it yet
        if isinstance(reply, dict):
            return reply
        raise ValueError(f"a urpc reply that is not an object: {reply!r}")
    raise ValueError(f"the connection ended after {len(buffer)} bytes of a reply")
