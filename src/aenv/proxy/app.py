"""The proxy as an ASGI callable: resolve the target sandbox, then forward HTTP or WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from starlette.types import Message, Receive, Scope, Send

from aenv.core import telemetry
from aenv.core.errors import AenvError
from aenv.core.ids import is_sandbox_id
from aenv.core.states import SandboxState
from aenv.orchestrator import traffic
from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import decode
from aenv.orchestrator.ops.resume import resume
from aenv.orchestrator.ops.settle import settled
from aenv.proxy import errors, forward, unresponsive, websocket
from aenv.proxy.routing import Target
from aenv.runtime.base import ENVD_PORT
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.proxy")

#: States a running sandbox passes through and comes back from by itself.
_PASSING = (SandboxState.SNAPSHOTTING, SandboxState.FORKING, SandboxState.RESUMING)


class Proxy:
    def __init__(self, node: Node) -> None:
        self.node = node

    async def aclose(self) -> None:
        """Nothing of its own: the keep-alive connections to guests are ``node.guests``'s
        (closed per slot by ``forget``: kill, pause, checkpoint)."""

    async def _auto_resume(self, sandbox_id: str) -> SandboxRecord | None:
        """Resume a paused sandbox created with ``autoResume`` because traffic arrived; None
        (→ 502) if it cannot be."""
        try:
            record, _ = await resume(self.node, sandbox_id, None)
        except AenvError as exc:
            log.warning("auto-resume of %s failed: %s", sandbox_id, exc.message)
            return None
        return record

    async def _cut(self, scope: Scope, receive: Receive, send: Send, sandbox_id: str) -> None:
        with contextlib.suppress(Exception):  # the response may have started: then just end
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1012})
            else:
                await errors.sandbox_not_found(sandbox_id)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """:meth:`_serve`, counted (``core/telemetry.py``): requests by status class, and the
        time to the answer's first byte."""
        began, status = time.monotonic(), 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                telemetry.PROXY_SECONDS.observe(time.monotonic() - began)
            await send(message)

        try:
            await self._serve(scope, receive, counted if scope["type"] == "http" else send,
                              target)
        finally:
            if scope["type"] == "http":
                telemetry.PROXY_REQUESTS.labels(
                    code=f"{status // 100}xx" if status else "none").inc()

    async def _serve(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        record = None
        # Traffic, for the idle auto-pause: before the record is read, so that a pause taking
        # it meanwhile sees this request (orchestrator/idle.py); again when the stream ends.
        self.node.activity.touch(target.sandbox_id)
        if is_sandbox_id(target.sandbox_id):
            record = await self.node.store.get(target.sandbox_id)
        if record is not None and record.state in _PASSING:
            # The sandbox runs on once its memory is saved (or restored): wait, do not 502.
            with contextlib.suppress(AenvError):
                record = await settled(self.node, record.sandbox_id)
        if (record is not None and target.port != ENVD_PORT
                and not traffic.admits(record, _header(scope, traffic.HEADER))):
            # Before any auto-resume: a request without the token wakes nothing.
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await errors.traffic_token_refused(record.sandbox_id)(scope, receive, send)
            return
        if (record is not None and record.auto_resume
                and record.state in (SandboxState.PAUSED, SandboxState.PAUSING)):
            record = await self._auto_resume(record.sandbox_id)
        if record is None or record.state != SandboxState.RUNNING:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await errors.sandbox_not_found(target.sandbox_id)(scope, receive, send)
            return
        if (refused := unresponsive.refusal(self.node.liveness, record.sandbox_id,
                                            target.port)) is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
            else:
                await refused(scope, receive, send)
            return
        slot, _ = decode(record.instance, record.sandbox_id)
        assert slot is not None
        task = asyncio.current_task()
        assert task is not None
        self.node.streams.add(record.sandbox_id, task)
        try:
            if scope["type"] == "websocket":
                sock = await self.node.guests.open_socket(slot, target.port)
                await websocket.relay(scope, receive, send, sock=sock, host=slot.guest_ip,
                                      port=target.port)
                return
            if (host := traffic.masked_host(record, target.port)) is not None:
                scope = _with_host(scope, host)
            await forward.forward(
                scope, receive, send, guests=self.node.guests, slot=slot,
                sandbox_id=record.sandbox_id, port=target.port,
            )
        except forward.ClientDisconnected:
            return
        except asyncio.CancelledError:
            if not self.node.streams.was_aborted(task):
                raise  # the server is shutting down
            # The sandbox was killed, paused or checkpointed under this request: end it as a
            # proxy does, not with a traceback and a 500.
            task.uncancel()
            await self._cut(scope, receive, send, record.sandbox_id)
        except OSError:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
                return
            raise
        finally:
            self.node.streams.discard(record.sandbox_id, task)
            self.node.activity.touch(record.sandbox_id)


def _header(scope: Scope, name: str) -> str | None:
    key = name.encode()
    for k, v in scope.get("headers") or ():
        if k.lower() == key:
            return str(v.decode("latin-1"))
    return None


def _with_host(scope: Scope, host: str) -> Scope:
    """``scope`` with its ``Host`` replaced (``maskRequestHost``)."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"host"]
    return {**scope, "headers": [(b"host", host.encode("latin-1")), *headers]}

