"""The `POST /execute` response: NDJSON lines as the execution makes them, and the client's
departure turned into an interrupt.

Owns the ASGI response and nothing about kernels: it reads an Execution's lines and calls
`abandon()` when the client goes away. The SDKs bound an execution by their read timeout and
simply close the connection; E2B's server then interrupts the kernel so the next cell runs at
once. The departure is seen two ways: uvicorn delivers `http.disconnect` when the TCP
connection closes (watched concurrently here), and a write to a dead connection fails (the
kernel module sends keepalive lines during silence, for proxies that keep their side open).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from starlette.types import Receive, Scope, Send

from aenv.interpreter.execution import Execution

log = logging.getLogger(__name__)


class ExecutionResponse:
    """An ASGI response streaming ``execution``'s lines, one JSON object per line."""

    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        self.complete = False  # every line was written

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = asyncio.create_task(self._body(send))
        watcher = asyncio.create_task(self._watch(receive))
        try:
            done, _ = await asyncio.wait({body, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if body not in done:
                body.cancel()
            if self.complete:
                return  # uvicorn reports a disconnect once a response is complete, too
            # The client is gone (or writing to it failed): free the kernel.
            log.info("client left during an execution: interrupting it")
            self.execution.abandon()
        except BaseException:
            self.execution.abandon()
            raise
        finally:
            for task in (body, watcher):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _body(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        async for line in self.execution.stream():
            data = (json.dumps(line) + "\n").encode()
            await send({"type": "http.response.body", "body": data, "more_body": True})
        self.complete = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
