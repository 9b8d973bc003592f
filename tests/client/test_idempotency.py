"""``Idempotency-Key`` on create, end to end: the client's key is honoured by the node."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from aenv.client import AsyncClient, Conflict
from tests.client.conftest import labelled
from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]


async def test_two_concurrent_creates_with_one_key_are_one_sandbox(
        client: AsyncClient, node: NodeServer) -> None:
    first, second = await asyncio.gather(
        client.create(timeout=120, idempotency_key="one-logical-create"),
        client.create(timeout=120, idempotency_key="one-logical-create"))
    assert first.sandbox_id == second.sandbox_id
    assert labelled(node, run=client.run_id) == [first.sandbox_id]
    # After it ran: replayed, still no second sandbox; another body with the key is refused.
    again = await client.create(timeout=120, idempotency_key="one-logical-create")
    assert again.sandbox_id == first.sandbox_id
    with pytest.raises(Conflict, match="different request"):
        await client.create(timeout=60, idempotency_key="one-logical-create")
    other = await client.create(timeout=120)  # a fresh key per logical create
    assert sorted(labelled(node, run=client.run_id)) == sorted(
        [first.sandbox_id, other.sandbox_id])


async def test_the_node_replays_the_same_body_on_v1_and_v2(node: NodeServer) -> None:
    body = {"templateID": "base", "timeout": 60, "metadata": {"run": "idem-raw"}}
    headers = {"X-API-KEY": API_KEY, "Idempotency-Key": "raw-key-1"}
    async with httpx.AsyncClient(base_url=node.url, timeout=60) as http:
        try:
            answers = await asyncio.gather(
                http.post("/v2/sandboxes", json=body, headers=headers),
                http.post("/v2/sandboxes", json=body, headers=headers),
                http.post("/sandboxes", json=body, headers=headers))
            assert [a.status_code for a in answers] == [201, 201, 201]
            assert answers[0].json() == answers[1].json() == answers[2].json()
            assert labelled(node, run="idem-raw") == [answers[0].json()["sandboxID"]]
            bad = await http.post("/v2/sandboxes", json=body,
                                  headers={**headers, "Idempotency-Key": "x" * 256})
            assert bad.status_code == 400 and bad.json()["code"] == 400
            unkeyed = await http.post("/v2/sandboxes", json=body,
                                      headers={"X-API-KEY": API_KEY})
            assert unkeyed.status_code == 201
            assert unkeyed.json()["sandboxID"] != answers[0].json()["sandboxID"]
        finally:
            for sandbox_id in labelled(node, run="idem-raw"):
                await http.delete(f"/sandboxes/{sandbox_id}", headers=headers)
