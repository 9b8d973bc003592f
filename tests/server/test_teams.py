"""Two teams on one node (docs/teams.md): neither sees nor touches the other's objects through
any route, keys are made, named, used and revoked, and a node from before teams keeps its
key as the default team's. The fake runtime: what is checked is the API's door, not the
sandboxes (the real-runtime half is tests/server/test_teams_runtime.py)."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox, SandboxQuery
from e2b.exceptions import NotFoundException

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
from tests.tenancy_walk import make_objects, walk

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


def _raw(node: NodeServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=node.url, timeout=60, headers={"X-API-KEY": key})


def _new_team(node: NodeServer, name: str) -> dict[str, Any]:
    with _raw(node, API_KEY) as operator:
        made = operator.post("/teams", json={"name": name})
    assert made.status_code == 201, made.text
    team: dict[str, Any] = made.json()
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", team["apiKey"]) and not team["isDefault"]
    return team


def test_a_second_team_reaches_nothing_of_the_first_through_any_route(
        node: NodeServer) -> None:
    # Team A: the default team, through the operator key a node from before teams had.
    sbx = Sandbox.create(timeout=300, metadata={"team": "a"})
    with _raw(node, API_KEY) as a:
        ids, secrets = make_objects(a, sbx.sandbox_id, sbx._envd_access_token or "")
        spec = a.get("/openapi.json").json()
    team_b = _new_team(node, "team-b")
    b_key = team_b["apiKey"]
    with _raw(node, b_key) as b:
        walked = walk(b, spec, ids, secrets, team_b["teamID"])
    assert walked >= 50

    # Everything of A's is still there and untouched, for A.
    with _raw(node, API_KEY) as a:
        assert a.get(f"/sandboxes/{sbx.sandbox_id}").json()["state"] == "running"
        assert a.get(f"/volumes/{ids['volume_id']}").status_code == 200
        assert ids["snapshot_id"] in a.get("/snapshots").text
        assert [k["name"] for k in a.get("/api-keys").json()] == ["a-ci"]
        assert ids["template_id"] in a.get("/templates").text

    # The SDK as team B: its list is empty, A's sandbox is not found, its own works.
    assert Sandbox.list(api_key=b_key, query=SandboxQuery()).next_items() == []
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=b_key)
    assert Sandbox.kill(sbx.sandbox_id, api_key=b_key) is False  # the SDK's "not found"
    own = Sandbox.create(timeout=120, api_key=b_key)
    listed = [s.sandbox_id for s in Sandbox.list(api_key=b_key).next_items()]
    assert listed == [own.sandbox_id]
    assert own.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    # A fork of B's sandbox is B's.
    with _raw(node, b_key) as b:
        forked = b.post(f"/sandboxes/{own.sandbox_id}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        child = forked.json()[0]["sandbox"]["sandboxID"]
        assert {s["sandboxID"] for s in b.get("/v2/sandboxes").json()} == {
            own.sandbox_id, child}
    sbx.kill()


def test_keys_are_made_named_used_and_revoked_at_once(node: NodeServer) -> None:
    team = _new_team(node, "team-c")
    first = team["apiKey"]
    with _raw(node, first) as c:
        made = c.post("/api-keys", json={"name": "rollouts"})
        assert made.status_code == 201, made.text
        second = made.json()
        assert second["mask"]["maskedValueSuffix"] == second["key"][-4:]
        assert second["mask"]["valueLength"] == len(second["key"]) == 44
    with _raw(node, second["key"]) as rollouts:
        assert rollouts.get("/v2/sandboxes").status_code == 200
        listed = {k["name"]: k for k in rollouts.get("/api-keys").json()}
        # The value is shown once: no listing has it.
        assert set(listed) == {"default", "rollouts"}
        assert all("key" not in k for k in listed.values())
        assert listed["rollouts"]["lastUsed"] is not None
        assert rollouts.patch(f"/api-keys/{second['id']}",
                              json={"name": "rl-run-7"}).status_code == 200
        # A team key cannot make teams, drain the node, or act as the operator.
        assert rollouts.post("/teams", json={"name": "x"}).status_code == 403
        assert rollouts.post("/node/drain").status_code == 403
    with _raw(node, first) as c:
        names = [k["name"] for k in c.get("/api-keys").json()]
        assert names == ["default", "rl-run-7"]
        assert c.delete(f"/api-keys/{second['id']}").status_code == 204
        assert c.delete(f"/api-keys/{second['id']}").status_code == 404
    # Revoked: the very next call is refused, on every route.
    with _raw(node, second["key"]) as revoked:
        assert revoked.get("/v2/sandboxes").status_code == 401
        assert revoked.post("/sandboxes", json={"templateID": "base"}).status_code == 401

    # An access token (E2B's ``Authorization: Bearer``) acts for its team too, and is revoked
    # the same way; it is not an API key.
    with _raw(node, first) as c:
        token = c.post("/access-tokens", json={"name": "cli"}).json()
    bearer = {"Authorization": f"Bearer {token['token']}"}
    with httpx.Client(base_url=node.url, timeout=30) as raw:
        assert raw.get("/api-keys", headers=bearer).status_code == 200
        assert raw.get("/api-keys", headers={"X-API-KEY": token["token"]}).status_code == 401
        with _raw(node, first) as c:
            assert c.delete(f"/access-tokens/{token['id']}").status_code == 204
        assert raw.get("/api-keys", headers=bearer).status_code == 401

    # The operator (E2B's X-Admin-Token) manages any team's keys, and deletes an empty team.
    admin = {"X-Admin-Token": API_KEY}
    with httpx.Client(base_url=node.url, timeout=30) as raw:
        made = raw.post(f"/admin/teams/{team['teamID']}/api-keys", json={"name": "ops"},
                        headers=admin)
        assert made.status_code == 201, made.text
        as_team = {**admin, "X-Team-ID": team["teamID"]}
        assert "ops" in [k["name"] for k in raw.get("/api-keys", headers=as_team).json()]
        assert raw.delete(f"/admin/teams/{team['teamID']}/api-keys/{made.json()['id']}",
                          headers=admin).status_code == 204
    with _raw(node, API_KEY) as operator:
        everyone = {t["name"] for t in operator.get("/teams").json()}
        assert everyone == {"default", "team-c"}
        assert operator.post("/teams", json={"name": "team-c"}).status_code == 409
        default = next(t for t in operator.get("/teams").json() if t["isDefault"])
        assert operator.delete(f"/teams/{default['teamID']}").status_code == 400
        assert operator.delete(f"/teams/{team['teamID']}").status_code == 204
    with _raw(node, first) as gone:
        assert gone.get("/v2/sandboxes").status_code == 401


def test_a_team_owning_sandboxes_is_not_deleted_and_the_audit_names_the_key(
        node: NodeServer) -> None:
    team = _new_team(node, "team-d")
    own = Sandbox.create(timeout=120, api_key=team["apiKey"])
    with _raw(node, API_KEY) as operator:
        assert operator.delete(f"/teams/{team['teamID']}").status_code == 409
        log = operator.get("/audit", params={"limit": 20}).json()["entries"]
    made = next(e for e in log if e["objectID"] == own.sandbox_id)
    assert (made["teamID"], made["keyName"], made["status"]) == (team["teamID"], "default", 201)
    with _raw(node, team["apiKey"]) as d:
        # A team reads its own audit entries only.
        mine = d.get("/audit").json()["entries"]
        assert mine and all(e["teamID"] == team["teamID"] for e in mine)
    own.kill()
    with _raw(node, API_KEY) as operator:
        assert operator.delete(f"/teams/{team['teamID']}").status_code == 204
    assert json.dumps(log)  # the log is plain JSON


def test_volume_names_are_each_teams_own(node: NodeServer) -> None:
    """E2B's volume names are unique per team: two teams each have a ``shared`` volume, each
    sees and deletes only its own, and a second ``shared`` in one team is still a 400."""
    team_b = _new_team(node, "team-b")
    with _raw(node, API_KEY) as a, _raw(node, team_b["apiKey"]) as b:
        mine = a.post("/volumes", json={"name": "shared"})
        theirs = b.post("/volumes", json={"name": "shared"})
        assert mine.status_code == theirs.status_code == 201, (mine.text, theirs.text)
        assert mine.json()["volumeID"] != theirs.json()["volumeID"]
        assert a.post("/volumes", json={"name": "shared"}).status_code == 400
        assert b.post("/volumes", json={"name": "shared"}).status_code == 400
        assert [v["volumeID"] for v in a.get("/volumes").json()] == [mine.json()["volumeID"]]
        assert [v["volumeID"] for v in b.get("/volumes").json()] == [theirs.json()["volumeID"]]
        assert b.delete(f"/volumes/{theirs.json()['volumeID']}").status_code == 204
        assert a.get(f"/volumes/{mine.json()['volumeID']}").status_code == 200
        # The name is free again for B, and A's is untouched.
        assert b.post("/volumes", json={"name": "shared"}).status_code == 201
        assert a.post("/volumes", json={"name": "shared"}).status_code == 400
