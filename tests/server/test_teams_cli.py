"""``aenv team`` and ``aenv keys`` on a node (fake runtime: what is checked is the CLI over the
teams routes, docs/teams.md): the operator makes a team and hands out its first key, the team
makes, names and revokes its own keys, the operator makes and revokes a team's key through the
admin routes, and deletes the team. A key's value is printed once, by the command that makes
it; a revoked key is refused from the next call on."""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli_run import Cli, Result
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

KEY = re.compile(r"e2b_[0-9a-f]{40}")


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


def _ok(result: Result) -> Result:
    assert result.code == 0, result
    return result


def _field(result: Result, label: str) -> str:
    """``label  value`` from a create's output."""
    found = re.search(rf"^{label}\s+(\S+)$", result.stdout, re.MULTILINE)
    assert found, result
    return found.group(1)


def _status(node: NodeServer, key: str) -> int:
    with httpx.Client(base_url=node.url, timeout=30, headers={"X-API-KEY": key}) as raw:
        return raw.get("/v2/sandboxes").status_code


def test_teams_and_keys_from_the_command_line(node: NodeServer) -> None:
    cli = Cli(node)  # the operator key

    # The operator makes a team: its id and its first key, shown once.
    made = _ok(cli("team", "create", "t1"))
    team_id, team_key = _field(made, "team id"), _field(made, "api key")
    assert KEY.fullmatch(team_key) and "shown only now" in made.stderr
    assert _status(node, team_key) == 200
    listed = _ok(cli("team", "list"))
    rows = {line.split()[1]: line for line in listed.stdout.splitlines()[1:]}
    assert set(rows) == {"default", "t1"} and "yes" in rows["default"]
    assert team_id in rows["t1"] and team_key not in listed.stdout
    as_json = json.loads(_ok(cli("team", "list", "--json")).stdout)
    assert [(t["name"], t["is_default"]) for t in as_json] == [("default", True), ("t1", False)]

    # The team makes its own key with its key: the value once, then only its mask.
    as_t1 = {"E2B_API_KEY": team_key}
    ci = _ok(cli("keys", "create", "ci", env=as_t1))
    ci_id, ci_key = _field(ci, "key id"), _field(ci, "api key")
    assert KEY.fullmatch(ci_key) and ci_key != team_key and "shown only now" in ci.stderr
    assert _status(node, ci_key) == 200
    keys = _ok(cli("keys", "list", env=as_t1))
    assert "ci" in keys.stdout and ci_id in keys.stdout and "default" in keys.stdout
    assert ci_key not in keys.stdout and team_key not in keys.stdout
    assert f"e2b_…{ci_key[-4:]}" in keys.stdout
    _ok(cli("keys", "rename", ci_id, "ci-2", env=as_t1))
    renamed = json.loads(_ok(cli("keys", "list", "--json", env=as_t1)).stdout)
    assert {k["key_id"]: k["name"] for k in renamed}[ci_id] == "ci-2"
    assert "key" not in renamed[0] and ci_key not in json.dumps(renamed)
    # The operator's own list is the default team's: not t1's keys.
    assert ci_id not in _ok(cli("keys", "list")).stdout

    # Revoked: refused from the next call on; a second revoke finds nothing.
    assert _ok(cli("keys", "revoke", ci_id, env=as_t1)).stdout.strip() == ci_id
    assert _status(node, ci_key) == 401
    again = cli("keys", "revoke", ci_id, env=as_t1)
    assert again.code == 1 and again.errors() == [f"error: no API key {ci_id}"], again

    # The operator, through the admin routes: a key of t1's, then revoked.
    svc = _ok(cli("keys", "create", "svc", "--team", team_id, "--json"))
    made_key = json.loads(svc.stdout)
    assert KEY.fullmatch(made_key["key"]) and made_key["name"] == "svc"
    assert _status(node, made_key["key"]) == 200
    assert made_key["key_id"] in _ok(cli("keys", "list", env=as_t1)).stdout
    _ok(cli("keys", "revoke", made_key["key_id"], "--team", team_id))
    assert _status(node, made_key["key"]) == 401

    # A team's key cannot make teams: one error line, no traceback.
    refused = cli("team", "create", "t2", env=as_t1)
    assert refused.code == 1 and len(refused.errors()) == 1, refused
    assert "403" in refused.stderr and "Traceback" not in refused.stderr
    # Nor see other teams.
    assert "default" not in _ok(cli("team", "list", env=as_t1)).stdout

    # The operator deletes the team: its keys go with it.
    assert _ok(cli("team", "delete", team_id)).stdout.strip() == team_id
    assert _status(node, team_key) == 401
    assert "t1" not in _ok(cli("team", "list")).stdout
    gone = cli("team", "delete", team_id)
    assert gone.code == 1 and gone.errors() == [f"error: no team {team_id}"], gone
    assert _status(node, API_KEY) == 200
