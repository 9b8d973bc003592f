"""The proxy as an ASGI callable: resolve the target sandbox, then forward HTTP or WebSocket."""

from __future__ import annotations

import asyncio
import logging

import httpx
from starlette.types import Receive, Scope, Send

from aenv.core.ids import is_sandbox_id
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import decode
from aenv.proxy import errors, forward, websocket
from aenv.proxy.routing import Target

log = logging.getLogger("aenv.proxy")


class Proxy:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def drop(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            asyncio.get_running_loop().create_task(client.aclose())

    async def _prune(self) -> None:
        """Close clients of sandboxes that are gone (a kill needs no request to clean up)."""
        for sandbox_id in list(self._clients):
            if await self.node.store.get(sandbox_id) is None:
                self.drop(sandbox_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        record = None
        if is_sandbox_id(target.sandbox_id):
            record = await self.node.store.get(target.sandbox_id)
        if record is None or record.state != SandboxState.RUNNING:
            if record is None:
                self.drop(target.sandbox_id)
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await errors.sandbox_not_found(target.sandbox_id)(scope, receive, send)
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
            client = self._clients.get(record.sandbox_id)
            if client is None:
                await self._prune()
                client = httpx.AsyncClient(
                    transport=self.node.guests.transport(slot), timeout=forward.UPSTREAM_TIMEOUT
                )
                self._clients[record.sandbox_id] = client
            await forward.forward(
                scope, receive, send, client=client, sandbox_id=record.sandbox_id,
                host=slot.guest_ip, port=target.port,
            )
        except forward.ClientDisconnected:
            return
        except OSError:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1011})
                return
            raise
        finally:
            self.node.streams.discard(record.sandbox_id, task)
