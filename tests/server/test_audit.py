"""The audit log on a node (fake runtime: what is audited is the API, not the sandboxes):
lifecycle calls through the official SDK, a refused key and a call on a missing sandbox all
appear with who, what, which object, from where and the outcome; reads do not; the CLI and
the client read the same log (docs/audit.md)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from aenv.api.audit import actor_of
from tests.cli_run import Cli
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
                              warm_pool_size="0", precreate_pool_size="0")
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


def test_who_did_what_to_which_object(node: NodeServer) -> None:
    me = actor_of(API_KEY)
    sbx = Sandbox.create(timeout=120)
    sbx.set_timeout(200)
    sbx.kill()
    with httpx.Client(base_url=node.url, timeout=30) as raw:
        assert raw.delete(f"/sandboxes/{sbx.sandbox_id}",
                          headers={"X-API-KEY": API_KEY}).status_code == 404
        assert raw.post("/sandboxes", json={"templateID": "base"},
                        headers={"X-API-KEY": "not-the-key"}).status_code == 401
        assert raw.get("/sandboxes", headers={"X-API-KEY": API_KEY}).status_code == 200
        log = raw.get("/audit", params={"limit": 50}, headers={"X-API-KEY": API_KEY})
        assert log.status_code == 200, log.text
        entries = log.json()["entries"]
        # Reading the log needs the key too.
        assert raw.get("/audit").status_code == 401
    # Newest first; reads (the list, the SDK's GETs) are not in it.
    assert [(e["action"], e["objectID"], e["status"], e["actor"]) for e in entries] == [
        ("POST /sandboxes", None, 401, actor_of("not-the-key")),
        ("DELETE /sandboxes/{sandbox_id}", sbx.sandbox_id, 404, me),
        ("DELETE /sandboxes/{sandbox_id}", sbx.sandbox_id, 204, me),
        ("POST /sandboxes/{sandbox_id}/timeout", sbx.sandbox_id, 204, me),
        ("POST /v2/sandboxes", sbx.sandbox_id, 201, me),  # the SDK's create
    ]
    assert all(e["client"] == "127.0.0.1" for e in entries)
    assert entries[0]["seq"] > entries[-1]["seq"] and entries[0]["at"] >= entries[-1]["at"]
    assert API_KEY not in json.dumps(entries)

    # The CLI reads the same log, one object's history at a time.
    result = Cli(node)("audit", "--object", sbx.sandbox_id, "--json")
    assert result.code == 0, result
    assert [(e["action"], e["status"]) for e in json.loads(result.stdout)] == [
        ("DELETE /sandboxes/{sandbox_id}", 404), ("DELETE /sandboxes/{sandbox_id}", 204),
        ("POST /sandboxes/{sandbox_id}/timeout", 204), ("POST /v2/sandboxes", 201)]
    table = Cli(node)("audit", "--limit", "2")
    assert table.code == 0 and "POST /sandboxes" in table.stdout and "401" in table.stdout
