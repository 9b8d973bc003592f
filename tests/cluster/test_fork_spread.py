"""A fork spread over nodes makes the same children wherever they land.

The parent's node forks what fits (``orchestrator/ops/fork.py``); the gateway makes the rest
on another node from a snapshot of the parent (``cluster/fork_spread.py``). A parent with
every setting away from its default is forked into children on both nodes, and each child
made elsewhere is compared with one made beside its parent, field by field: its E2B detail,
its node's record, what runs inside it (boot id, environment), and what its timeout does.
Nodes each in a network namespace of their own, a real scheduler, gateway, Redis and S3
server (``test_move.py``'s cluster)."""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from aenv.cluster.fork_spread import child_body
from tests.cluster.layout import Namespace
from tests.cluster.test_gateway import node_of
from tests.cluster.test_move import cluster
from tests.redis_server import RedisServer
from tests.server.harness import API_KEY, NodeServer

#: What differs between any two sandboxes: who they are, where, and when.
DETAIL_OWN = {"sandboxID", "clientID", "envdAccessToken", "startedAt", "endAt"}
RECORD_OWN = {"sandbox_id", "client_id", "envd_token", "created_at", "started_at", "end_at",
              "state_changed_at", "version", "instance"}
#: Seconds a paused child may take to show as paused after its timeout (the TTL loop, then
#: a pause written to disk on a loaded machine).
PAUSE_WAIT_S = 90.0
IAM_AUDIENCE = "https://api.example.test"


def _record(node: NodeServer, sandbox_id: str) -> dict[str, Any]:
    db = sqlite3.connect(node.home / "state.db")
    db.row_factory = sqlite3.Row
    try:
        row = db.execute("SELECT * FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
                         ).fetchone()
    finally:
        db.close()
    assert row is not None, f"{sandbox_id} has no record on {node.home}"
    return dict(row)


def _without(values: dict[str, Any], own: set[str]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in own}


def _paused(api: httpx.Client, sandbox_id: str) -> dict[str, Any]:
    """Its detail once paused and its pause over (paused shows before the pause ends)."""
    deadline = time.monotonic() + PAUSE_WAIT_S
    while True:
        detail: dict[str, Any] = api.get(f"/sandboxes/{sandbox_id}").json()
        if detail.get("state") == "paused" and not (detail.get("aenv") or {}).get("operation"):
            return detail
        assert time.monotonic() < deadline, f"{sandbox_id} did not pause: {detail}"
        time.sleep(0.5)


def test_the_create_of_a_child_elsewhere_carries_what_the_parent_has() -> None:
    parent = {"templateID": "base", "alias": "base", "metadata": {"k": "v"},
              "allowInternetAccess": False, "network": {"denyOut": ["0.0.0.0/0"]},
              "iam": {"tokens": {"api": {"audience": "a", "tokenType": "JWT-SVID"}}},
              "lifecycle": {"onTimeout": "pause", "autoResume": True,
                            "autoPauseMemory": False}}
    assert child_body(parent, "snap1", 60) == {
        "templateID": "snap1", "timeout": 60, "autoPause": True, "autoPauseMemory": False,
        "autoResume": {"enabled": True}, "allow_internet_access": False,
        "network": {"denyOut": ["0.0.0.0/0"]},
        "iam": {"tokens": {"api": {"audience": "a", "tokenType": "JWT-SVID"}}},
        "forkOf": {"templateID": "base", "alias": "base"}}
    # A node that does not say what its pause keeps: memory too, the default.
    plain = child_body({"templateID": "t", "lifecycle": {"onTimeout": "kill",
                                                          "autoResume": False}}, "s", None)
    assert plain["autoPauseMemory"] is True and plain["autoPause"] is False
    assert "timeout" not in plain and plain["forkOf"] == {"templateID": "t", "alias": None}
    assert plain["iam"] is None


@pytest.mark.gvisor
@pytest.mark.timeout(600)
def test_children_on_another_node_are_those_made_beside_the_parent(
        redis_server: RedisServer, hub: tuple[str, list[Namespace]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    nonce = secrets.token_hex(3)
    with cluster(redis_server, hub, monkeypatch, "fs", max_sandboxes="3") as c, \
         httpx.Client(base_url=c.gateway.url, headers={"X-API-KEY": API_KEY},
                      timeout=180) as api:
        made = api.post("/sandboxes", json={
            "templateID": "base", "timeout": 600,
            "metadata": {"purpose": "fork-spread", "nonce": nonce,
                         "aenv.idlePauseSeconds": "3600"},
            "envVars": {"FORK_SPREAD": nonce},
            "autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True},
            "allow_internet_access": False,
            "network": {"allowOut": ["10.9.8.7/32"], "denyOut": ["0.0.0.0/0"]},
            "iam": {"tokens": {"api": {"audience": IAM_AUDIENCE, "tokenType": "JWT-SVID"}}},
        })
        assert made.status_code == 201, made.text
        parent_id = made.json()["sandboxID"]
        assert node_of(redis_server, parent_id) == c.name("fs-a")  # A is the only node yet
        b = c.start_b()
        nodes = {c.name("fs-a"): c.a, c.name("fs-b"): b}

        # A holds the parent and two children (its limit is 3); the third goes to B.
        forked = api.post(f"/sandboxes/{parent_id}/fork", json={"count": 3, "timeout": 900})
        assert forked.status_code == 201, forked.text
        entries = forked.json()
        assert all("sandbox" in e for e in entries), entries
        children = [e["sandbox"] for e in entries]
        where = {ch["sandboxID"]: node_of(redis_server, ch["sandboxID"]) for ch in children}
        beside = [i for i in where if where[i] == c.name("fs-a")]
        elsewhere = [i for i in where if where[i] == c.name("fs-b")]
        assert len(beside) == 2 and len(elsewhere) == 1, where
        same_id, other_id = beside[0], elsewhere[0]
        out = {ch["sandboxID"]: ch for ch in children}

        # The fork's answer: the same sandbox but for who it is.
        assert _without(out[same_id], DETAIL_OWN) == _without(out[other_id], DETAIL_OWN)

        # The E2B detail: the same as each other and, but for who and when, as the parent.
        parent = api.get(f"/sandboxes/{parent_id}").json()
        same = api.get(f"/sandboxes/{same_id}").json()
        other = api.get(f"/sandboxes/{other_id}").json()
        assert _without(other, DETAIL_OWN) == _without(same, DETAIL_OWN)
        assert _without(same, DETAIL_OWN) == _without(parent, DETAIL_OWN)
        assert same["templateID"] == "base" and same["metadata"]["nonce"] == nonce
        assert same["lifecycle"] == {"onTimeout": "pause", "autoResume": True,
                                     "autoPauseMemory": False}
        assert same["allowInternetAccess"] is False
        assert same["network"] == {"allowOut": ["10.9.8.7/32"], "denyOut": ["0.0.0.0/0"]}
        # Its workload identity too: the record's tokens are compared with the rest below.
        assert same["iam"] == {"tokens": {"api": {"audience": IAM_AUDIENCE,
                                                  "tokenType": "JWT-SVID"}}}

        # The nodes' records: every column but who, when and the runtime's own.
        same_row = _record(nodes[str(where[same_id])], same_id)
        other_row = _record(nodes[str(where[other_id])], other_id)
        assert _without(other_row, RECORD_OWN) == _without(same_row, RECORD_OWN)
        for row in (same_row, other_row):
            assert round(row["end_at"] - row["started_at"]) == 900, row

        # Inside: the parent's boot continued, the parent's environment.
        def inside(sandbox_id: str) -> tuple[str, str]:
            sbx = Sandbox.connect(sandbox_id)
            boot = sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
            return boot, sbx.commands.run("printenv FORK_SPREAD").stdout

        assert inside(other_id) == inside(same_id) == inside(parent_id)
        assert inside(other_id)[1] == f"{nonce}\n"

        # At their timeout both pause the same way (their files only: autoPauseMemory).
        for child in (same_id, other_id):
            assert api.post(f"/sandboxes/{child}/timeout", json={"timeout": 1}
                            ).status_code == 204
        same_paused, other_paused = _paused(api, same_id), _paused(api, other_id)
        assert _without(other_paused, DETAIL_OWN) == _without(same_paused, DETAIL_OWN)
        memory_workspace = os.environ.get("AENV_TEST_WORKSPACE") == "memory"
        assert same_paused["pauseMode"] == ("full" if memory_workspace else "filesystem")

        for sandbox_id in (*where, parent_id):
            assert api.delete(f"/sandboxes/{sandbox_id}").status_code in (204, 404)
