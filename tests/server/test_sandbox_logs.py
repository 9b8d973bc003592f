"""A sandbox's logs through E2B's routes, read with the SDK's own generated API client
(docs/logs.md): its lifecycle — created, paused, resumed, snapshot, killed — in order, with
levels and fields; v2's cursor, direction, level and search; v1's shape; the logs of a killed
sandbox still read by its team; another team's key and an unknown id answer 404. The fake
runtime: the lifecycle is the node's, not the sandbox's (console lines: test_logs_console)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b.api import ApiClient
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.models import LogLevel, LogsDirection, SandboxLogs, SandboxLogsV2Response
from e2b.connection_config import ConnectionConfig

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(runtime="fake", net_pool_size="2", warm_pool_size="0",
                 precreate_pool_size="0") as server:
        yield server


def _api(node: NodeServer, key: str = API_KEY) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": key}, timeout=60)


def _v2(sandbox_id: str, key: str = API_KEY, **query: object) -> SandboxLogsV2Response:
    with ApiClient(ConnectionConfig(api_key=key)) as client:
        answer = get_v_2_sandboxes_sandbox_id_logs.sync_detailed(
            sandbox_id, client=client, **query)  # type: ignore[arg-type]
    assert answer.status_code == 200, answer.content
    assert isinstance(answer.parsed, SandboxLogsV2Response)
    return answer.parsed


def test_the_lifecycle_is_in_the_logs_and_outlives_the_sandbox(node: NodeServer) -> None:
    with _api(node) as api:
        sandbox_id = api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        assert api.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
        assert api.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 60}
                        ).status_code in (200, 201)
        assert api.post(f"/sandboxes/{sandbox_id}/snapshots", json={}).status_code == 201
        entries = _v2(sandbox_id).logs
        messages = [e.message for e in entries if e.level != LogLevel.DEBUG]
        assert messages[:3] == ["sandbox created", "sandbox paused", "sandbox resumed"]
        assert "snapshot taken" in messages
        stamps = [e.timestamp for e in entries]
        assert stamps == sorted(stamps)
        created = entries[0]
        assert created.level == LogLevel.INFO
        assert created.fields.additional_properties == {"event": "state:running",
                                                        "from": "creating"}
        # Filters: the minimum level, a substring, newest first, a page and its cursor.
        infos = _v2(sandbox_id, level=LogLevel.INFO).logs
        assert infos and all(e.level != LogLevel.DEBUG for e in infos)
        assert [e.message for e in _v2(sandbox_id, search="resumed").logs] == ["sandbox resumed"]
        assert _v2(sandbox_id, search="Resumed").logs == []  # case-sensitive, as E2B
        newest = _v2(sandbox_id, direction=LogsDirection.BACKWARD, limit=1).logs
        assert len(newest) == 1 and newest[0].message == entries[-1].message
        first = _v2(sandbox_id, limit=2).logs
        cursor = int(first[-1].timestamp.timestamp() * 1000)
        after = _v2(sandbox_id, cursor=cursor).logs
        assert after[0].timestamp >= first[-1].timestamp
        assert len(after) >= len(entries) - 2

        assert api.delete(f"/sandboxes/{sandbox_id}").status_code == 204
        assert api.get(f"/sandboxes/{sandbox_id}").status_code == 404
    ended = _v2(sandbox_id).logs
    assert ended[-1].message == "sandbox killed"
    with ApiClient(ConnectionConfig(api_key=API_KEY)) as client:
        old = get_sandboxes_sandbox_id_logs.sync_detailed(sandbox_id, client=client)
    assert isinstance(old.parsed, SandboxLogs), old.content
    assert [line.line for line in old.parsed.logs] == [e.message for e in ended]
    assert len(old.parsed.log_entries) == len(ended)


def test_no_other_team_reads_them_and_bad_queries_are_400(node: NodeServer) -> None:
    with _api(node) as api:
        sandbox_id = api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        other = api.post("/teams", json={"name": "logs-other"}).json()["apiKey"]
        gone = api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        assert api.delete(f"/sandboxes/{gone}").status_code == 204
        for path in (f"/v2/sandboxes/{sandbox_id}/logs", f"/sandboxes/{sandbox_id}/logs",
                     f"/v2/sandboxes/{gone}/logs", "/v2/sandboxes/nosuchsandbox00/logs"):
            with _api(node, other) as them:
                refused = them.get(path)
            assert refused.status_code == 404, (path, refused.text)
            assert refused.json()["code"] == 404
        for query in ({"level": "loud"}, {"direction": "sideways"}, {"limit": "1001"},
                      {"cursor": "-1"}, {"search": "x" * 257}):
            bad = api.get(f"/v2/sandboxes/{sandbox_id}/logs", params=query)
            assert bad.status_code == 400, (query, bad.text)
            assert bad.json()["code"] == 400
        api.delete(f"/sandboxes/{sandbox_id}")
