"""Team quotas on a node (docs/teams.md): 40 creates at once against a team's limit of 3
running sandboxes start exactly 3 and refuse the rest with 429 and Retry-After; memory and
starts per second are held the same way; another team is not affected. The fake runtime:
what is checked is the gate, not the sandboxes."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.server.harness import (
    API_KEY,
    NodeServer,
    cleanup_home,
    client_env,
    kill_all_sandboxes,
    kill_leaked,
    start_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeServer]:
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    try:
        server = start_server(free_port(), home, runtime="fake", net_pool_size="2",
                              warm_pool_size="0", precreate_pool_size="0",
                              max_concurrent_starts="8", max_queued_starts="64")
    except BaseException:
        cleanup_home(home)
        raise
    for key, value in client_env(server).items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        try:
            kill_all_sandboxes()
        finally:
            server.stop()
        kill_leaked(server.home)
        cleanup_home(server.home)


def _team(node: NodeServer, name: str, quota: dict[str, Any]) -> dict[str, Any]:
    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=30) as op:
        made = op.post("/teams", json={"name": name, "quota": quota})
    assert made.status_code == 201, made.text
    team: dict[str, Any] = made.json()
    assert {k: v for k, v in team["quota"].items() if v is not None} == quota
    return team


async def _creates(node: NodeServer, key: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=node.url, headers={"X-API-KEY": key},
                                 timeout=120) as client:
        return list(await asyncio.gather(*(
            client.post("/sandboxes", json={"templateID": "base", "timeout": 300})
            for _ in range(count))))


def test_forty_creates_at_once_start_exactly_the_quota(node: NodeServer) -> None:
    team = _team(node, "capped", {"maxSandboxes": 3})
    answers = asyncio.run(_creates(node, team["apiKey"], 40))
    started = [a for a in answers if a.status_code == 201]
    refused = [a for a in answers if a.status_code == 429]
    assert len(started) == 3 and len(refused) == 37, [a.status_code for a in answers]
    assert all(int(a.headers["Retry-After"]) >= 1 for a in refused)
    assert all(a.headers["Aenv-Quota-Exceeded"] == "1" for a in refused)  # no other node tried
    assert "quota of 3 running sandboxes" in refused[0].json()["message"]
    key = {"X-API-KEY": team["apiKey"]}
    with httpx.Client(base_url=node.url, headers=key, timeout=60) as client:
        assert len(client.get("/v2/sandboxes").json()) == 3
        # The operator's (default) team has no quota and is not counted with this one.
        assert asyncio.run(_creates(node, API_KEY, 4))[0].status_code == 201
        # One killed: one more fits, and only one.
        assert client.delete(f"/sandboxes/{started[0].json()['sandboxID']}").status_code == 204
    again = asyncio.run(_creates(node, team["apiKey"], 5))
    assert sorted(a.status_code for a in again) == [201, 429, 429, 429, 429]
    # Forks count too: a fork of 2 from a team at its quota is refused, child by child.
    with httpx.Client(base_url=node.url, headers=key, timeout=60) as client:
        forked = client.post(f"/sandboxes/{started[1].json()['sandboxID']}/fork",
                             json={"count": 2})
        assert forked.status_code == 201, forked.text
        assert [e["error"]["code"] for e in forked.json()] == [429, 429]
        # Marked as the quota's: a gateway does not spread them over other nodes.
        assert {e["error"]["error"] for e in forked.json()} == {"quota_exceeded"}
        # Raised by the operator: the quota applies at once.
        op = {"X-API-KEY": API_KEY}
        assert client.patch(f"/teams/{team['teamID']}", json={"quota": {}}).status_code == 403
        raised = client.patch(f"/teams/{team['teamID']}", headers=op,
                              json={"quota": {"maxSandboxes": 5}})
        assert raised.status_code == 200, raised.text
        forked = client.post(f"/sandboxes/{started[1].json()['sandboxID']}/fork",
                             json={"count": 2})
        assert [("sandbox" in e) for e in forked.json()] == [True, True], forked.text


def test_memory_and_starts_per_second(node: NodeServer) -> None:
    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=30) as op:
        assert op.patch("/teams/nope", json={"quota": {}}).status_code == 404
        assert op.post("/teams", json={"name": "x", "quota": {"maxSandboxes": 0}}
                       ).status_code in (400, 422)
    team = _team(node, "slow", {"startsPerSecond": 1})
    first, second = sorted(asyncio.run(_creates(node, team["apiKey"], 2)),
                           key=lambda a: a.status_code)
    assert first.status_code == 201 and second.status_code == 429, (first.text, second.text)
    assert second.headers["Retry-After"] == "1"
    assert "1 sandbox starts per second" in second.json()["message"]
    # A refused start takes no token: one second on, the next one starts.
    time.sleep(1.1)
    assert asyncio.run(_creates(node, team["apiKey"], 1))[0].status_code == 201
    small = _team(node, "small", {"maxMemoryMB": 1})
    refused = asyncio.run(_creates(node, small["apiKey"], 1))[0]
    assert refused.status_code == 429 and "MB of memory" in refused.json()["message"]
