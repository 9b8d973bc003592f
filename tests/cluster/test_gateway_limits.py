"""The gateway holds request bodies to the nodes' limits before it buffers or forwards any
(docs/limits.md): 413 with E2B's body from the Content-Length, or once a chunked body passes
the limit. Nothing else is needed: a refused request never reaches Redis or a scheduler,
which are named here but not running."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis

from aenv.cluster.gateway import create_app
from aenv.edge.limits import BodyLimits

pytestmark = pytest.mark.anyio

LIMITS = BodyLimits(api=1024, proxy=4096, upload=1 << 20, idle_s=5)


@pytest.fixture
async def gateway() -> AsyncIterator[httpx.AsyncClient]:
    redis = Redis.from_url("redis://127.0.0.1:1/0")  # never connected to: see above
    app = create_app(redis, "http://127.0.0.1:1", None, limits=LIMITS)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gateway") as client:
        yield client
    await redis.aclose()


async def _pieces(total: int) -> AsyncIterator[bytes]:
    for _ in range(total // 256):
        yield b"x" * 256


def _is_e2b(answer: httpx.Response, status: int) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == status and isinstance(answer.json()["message"], str)


async def test_control_plane_bodies_are_limited(gateway: httpx.AsyncClient) -> None:
    _is_e2b(await gateway.post("/v2/sandboxes", content=b"x" * 2048), 413)
    answer = await gateway.post("/v2/sandboxes", content=_pieces(4096))  # chunked
    _is_e2b(answer, 413)
    assert answer.headers["connection"] == "close"


async def test_sandbox_traffic_has_its_own_limit(gateway: httpx.AsyncClient) -> None:
    headers = {"E2b-Sandbox-Id": "a" * 20, "E2b-Sandbox-Port": "49983"}
    _is_e2b(await gateway.post("/files", content=b"x" * 8192, headers=headers), 413)
