"""runsc's per-sandbox control socket: one urpc call, a JSON request and a JSON reply.

Every runsc sandbox serves urpc on ``<runsc --root>/runsc-<sandbox id>.sock`` (a Unix stream
socket); the CLI talks to it too, after ~20 ms of starting a Go binary and loading its state
file. Called directly, ``containerManager.Pause`` / ``Resume`` take well under a millisecond.
What the CLI also does and a direct call does not: update runsc's state file, so the caller
owns the truth about what it changed (see ``GvisorRuntime.freeze``).

The reply is ``{"success": bool, "err": str, "result": ...}``.
"""

from __future__ import annotations

import asyncio
import json
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
               timeout: float = CALL_TIMEOUT_S) -> Any:
    """Send ``method(arg)`` and return its result.

    Raises ``NotFound`` when nothing listens on the socket (the sandbox is gone; nothing was
    sent), ``CallFailed`` when the sandbox answered with an error, ``CallInDoubt`` when the
    request was sent but no complete answer came back.
    """
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(socket_path), limit=_MAX_REPLY), timeout
        )
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise NotFound(f"no runsc control socket at {socket_path}") from exc
    except (OSError, TimeoutError) as exc:
        raise RuntimeFailure(f"cannot reach runsc control socket {socket_path}: {exc!r}") from exc
    try:
        writer.write(json.dumps({"method": method, "arg": arg}).encode())
        reply = await asyncio.wait_for(_read_reply(reader), timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise CallInDoubt(f"{method} on {socket_path.name}: no answer ({exc!r})") from exc
    finally:
        writer.close()
    if not reply.get("success"):
        raise CallFailed(f"{method} on {socket_path.name}: {reply.get('err') or reply}")
    return reply.get("result")


async def _read_reply(reader: asyncio.StreamReader) -> dict[str, Any]:
    """urpc frames nothing: a reply ends where its JSON object does."""
    decoder = json.JSONDecoder()
    buffer = b""
    while len(buffer) < _MAX_REPLY:
        chunk = await reader.read(65536)
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
