"""Run commands in a sandbox through its envd, as the SDK does (``process.Process/Start``).

Used by template builds (RUN steps, the start and ready commands): the same path and the same
semantics users get, so user switching, env, workdir and the fallback shell of images without
bash behave exactly as in ``commands.run``. Speaks Connect's JSON streaming envelopes
(``[flags u8][length u32 BE][JSON]``, end of stream ``flags & 0x02``) over httpx.

The guest is untrusted: envelopes are size-capped and parsed into plain values; nothing from
the reply chooses anything on the host.
"""

from __future__ import annotations

import base64
import contextlib
import json
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from aenv.core.errors import DeadlineExceeded, Unavailable
from aenv.core.net import NetSlot
from aenv.runtime.base import ENVD_PORT

#: An envelope larger than this is a broken or hostile envd (output comes in small chunks).
MAX_ENVELOPE = 4 << 20
_END_STREAM = 0x02

#: ``on_output(stream, text)``: stream is ``stdout`` or ``stderr``.
OutputCallback = Callable[[str, str], None]


@dataclass(frozen=True)
class ProcessEnd:
    exit_code: int
    #: envd's description, e.g. ``exit status 1`` or ``signal: killed``.
    status: str
    error: str | None = None


def _headers(user: str, token: str | None, timeout_s: float | None) -> dict[str, str]:
    headers = {
        "Content-Type": "application/connect+json",
        "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode(),
    }
    if token:
        headers["X-Access-Token"] = token
    if timeout_s:
        headers["Connect-Timeout-Ms"] = str(int(timeout_s * 1000))
    return headers


def _envelope(message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(data)) + data


async def _envelopes(response: httpx.Response) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if length > MAX_ENVELOPE:
                raise Unavailable(f"envd sent a {length}-byte message")
            if len(buffer) < 5 + length:
                break
            raw, buffer = buffer[5:5 + length], buffer[5 + length:]
            try:
                message = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise Unavailable("envd sent a malformed message") from exc
            yield flags, message if isinstance(message, dict) else {}


def _start_body(cmd: str, args: list[str], envs: Mapping[str, str], cwd: str | None,
                tag: str | None = None) -> dict[str, Any]:
    process: dict[str, Any] = {"cmd": cmd, "args": args, "envs": dict(envs)}
    if cwd:
        process["cwd"] = cwd
    return {"process": process, "stdin": False, **({"tag": tag} if tag else {})}


def _stream_error(message: Mapping[str, Any]) -> str | None:
    error = message.get("error")
    if isinstance(error, dict):
        return f"{error.get('code', 'unknown')}: {error.get('message', '')}"
    return None


class EnvdProcesses:
    """Process calls on one sandbox's envd."""

    def __init__(self, transport: httpx.AsyncBaseTransport, slot: NetSlot,
                 token: str | None) -> None:
        self._http = httpx.AsyncClient(
            transport=transport, base_url=f"http://{slot.guest_ip}:{ENVD_PORT}",
            timeout=httpx.Timeout(30.0, read=None),
        )
        self._token = token

    async def __aenter__(self) -> EnvdProcesses:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    @contextlib.asynccontextmanager
    async def _started(
        self, cmd: str, args: list[str], user: str, cwd: str | None,
        envs: Mapping[str, str] | None, timeout_s: float | None, tag: str | None = None,
    ) -> AsyncIterator[AsyncIterator[tuple[int, dict[str, Any]]]]:
        """Inside: the envelopes of a ``Start`` stream envd accepted."""
        body = _envelope(_start_body(cmd, args, envs or {}, cwd, tag))
        async with self._http.stream(
            "POST", "/process.Process/Start", content=body,
            headers=_headers(user, self._token, timeout_s),
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")[:500]
                raise Unavailable(f"envd refused the command: {response.status_code} {text}")
            yield _envelopes(response)

    async def run(
        self, cmd: str, args: list[str], *, user: str, cwd: str | None = None,
        envs: Mapping[str, str] | None = None, timeout_s: float | None = None,
        on_output: OutputCallback | None = None,
    ) -> ProcessEnd:
        """Run ``cmd args`` to its end, streaming output to ``on_output``.

        Prerequisites: envd answers. On success: how the process ended (any exit code).
        On failure: ``DeadlineExceeded`` past ``timeout_s`` (envd kills the process);
        ``Unavailable`` if envd refuses the call or the stream breaks without an end event;
        ``InvalidArgument``-like refusals (unknown user, missing cwd) come back as
        ``Unavailable`` with envd's words.
        """
        try:
            async with self._started(cmd, args, user, cwd, envs, timeout_s) as envelopes:
                async for flags, message in envelopes:
                    if flags & _END_STREAM:
                        error = _stream_error(message)
                        if error is not None and error.startswith("deadline_exceeded"):
                            raise DeadlineExceeded(f"command timed out after {timeout_s}s")
                        if error is not None:
                            raise Unavailable(f"command failed: {error}")
                        break
                    event = message.get("event")
                    if not isinstance(event, dict):
                        continue
                    data = event.get("data")
                    if isinstance(data, dict) and on_output is not None:
                        for stream in ("stdout", "stderr"):
                            chunk = data.get(stream)
                            if isinstance(chunk, str):
                                on_output(stream, base64.b64decode(chunk).decode(
                                    "utf-8", "replace"))
                    end = event.get("end")
                    if isinstance(end, dict):
                        return ProcessEnd(
                            exit_code=int(end.get("exitCode", 0) or 0),
                            status=str(end.get("status", "")),
                            error=end.get("error") if isinstance(end.get("error"), str)
                            else None,
                        )
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"command timed out after {timeout_s}s") from exc
        except httpx.HTTPError as exc:
            raise Unavailable(f"envd stream broke: {exc!r}") from exc
        raise Unavailable("the command's stream ended without an end event")

    async def start(
        self, cmd: str, args: list[str], *, user: str, cwd: str | None = None,
        envs: Mapping[str, str] | None = None, tag: str | None = None,
    ) -> int:
        """Start a background process and return its pid once envd reports it started; the
        process outlives this call (as ``commands.run(background=True)``). ``tag``: envd's
        process tag (``START_TAG``: its output also goes to the sandbox's logs).

        On failure: ``Unavailable`` with envd's words.
        """
        try:
            async with self._started(cmd, args, user, cwd, envs, None, tag) as envelopes:
                async for flags, message in envelopes:
                    if flags & _END_STREAM:
                        raise Unavailable(
                            f"start command failed: {_stream_error(message) or 'no start'}")
                    event = message.get("event")
                    start = event.get("start") if isinstance(event, dict) else None
                    if isinstance(start, dict):
                        return int(start.get("pid", 0) or 0)
        except httpx.HTTPError as exc:
            raise Unavailable(f"envd stream broke: {exc!r}") from exc
        raise Unavailable("the start command's stream ended before it started")
