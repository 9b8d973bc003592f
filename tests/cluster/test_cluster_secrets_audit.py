"""One secrets store and one audit log for a whole cluster (docs/teams.md, "Secrets";
docs/audit.md): three nodes, a scheduler and a gateway over a real Redis (``layout.py``; the
fake runtime, since what is checked is the API, not the sandboxes). Through the real e2b
SDK's ``Secret`` API, aimed at one node at a time and at the gateway: a secret made on one
node is listed and read (never its value) on another, updated there, deleted on a third, and
its pages go on from node to node; Redis holds only ciphertext. The audit log read on a node
that served nothing shows what the others did, with the caller's team and key name. Redis
down: every node answers ``/secrets`` and ``/audit`` 503 with an E2B error body, never 500.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Secret, SecretNotFoundException
from redis import Redis

from aenv.cluster.keys import Keys
from tests.cluster.layout import Layout, cluster_layout
from tests.server.harness import API_KEY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
VALUE = "sk-live-0123456789abcdef"
#: Seconds for a node's trail to write what it recorded (it flushes every 0.5 s).
FLUSHED_S = 10.0


@pytest.fixture(scope="module")
def lay() -> Iterator[Layout]:
    with cluster_layout(schedulers=1, gateways=1, runtime="fake", net_pool_size="2",
                        warm_pool_size="0", max_sandboxes="20") as layout:
        yield layout


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"X-API-KEY": key}, timeout=60)


def _team(lay: Layout, name: str) -> dict[str, Any]:
    with _client(lay.gateways[0].url, API_KEY) as op:
        made = op.post("/teams", json={"name": name})
    assert made.status_code == 201, made.text
    team: dict[str, Any] = made.json()
    return team


def _on(url: str, key: str) -> dict[str, Any]:
    """The SDK's per-call options for the API at ``url``."""
    return {"api_url": url, "api_key": key, "retries": 0}


def test_a_secret_made_on_one_node_is_every_nodes(lay: Layout) -> None:
    team = _team(lay, "vaulted")
    key = team["apiKey"]
    a, b, c = (n.url for n in lay.nodes)
    gateway = lay.gateways[0].url
    made = Secret.create("OpenAI", VALUE, {"owner": "rl"}, **_on(a, key))
    assert made.name == "openai" and made.version == 1
    # Listed and read on the others, by name and by id; no answer carries the value.
    assert [s.secret_id for s in Secret.list(**_on(b, key)).next_items()] == [made.secret_id]
    assert Secret.get_info("openai", **_on(c, key)).metadata == {"owner": "rl"}
    assert Secret.get_info(made.secret_id, **_on(gateway, key)).name == "openai"
    for url in (a, b, c, gateway):
        with _client(url, key) as raw:
            for path in ("/secrets", f"/secrets/{made.secret_id}", "/secrets/openai"):
                answer = raw.get(path)
                assert answer.status_code == 200 and VALUE not in answer.text, (url, path)
            # One name per team, whichever node is asked.
            assert raw.post("/secrets", json={"name": "openai", "value": "x"}
                            ).status_code == 409, url
    # Updated on B: a new version on every node, through the gateway too.
    updated = Secret.update("openai", VALUE + "-2", **_on(b, key))
    assert updated.version == 2 and updated.metadata == {"owner": "rl"}
    assert Secret.get_info("openai", **_on(a, key)).version == 2
    assert Secret.get_info("openai", **_on(gateway, key)).version == 2
    # Pages go on from one node to the next (the token is the last name seen).
    for n in range(3):
        Secret.create(f"k{n}", "v", **_on((a, b, c)[n], key))
    first = Secret.list(limit=2, **_on(a, key))
    names = [s.name for s in first.next_items()]
    assert first.has_next
    rest = Secret.list(limit=2, next_token=first.next_token, **_on(c, key))
    names += [s.name for s in rest.next_items()]
    assert names == ["k0", "k1", "k2", "openai"] and not rest.has_next
    # Another team sees none of them, on any node.
    other = _team(lay, "vaulted-not")["apiKey"]
    for url in (a, b, c):
        assert Secret.list(**_on(url, other)).next_items() == []
        assert not Secret.exists("openai", **_on(url, other))
    # Redis holds what the nodes sealed, never the value.
    redis = Redis.from_url(lay.redis.url, decode_responses=True)
    try:
        keys = Keys()
        rows = redis.hgetall(keys.secrets)
        assert made.secret_id in rows and not any(VALUE in r for r in rows.values())
    finally:
        redis.close()
    # Deleted on C: gone from every node.
    assert Secret.destroy("openai", **_on(c, key))
    for url in (a, b, gateway):
        with pytest.raises(SecretNotFoundException):
            Secret.get_info(made.secret_id, **_on(url, key))
    assert not Secret.destroy("openai", **_on(a, key))
    assert [s.name for s in Secret.list(**_on(b, key)).next_items()] == ["k0", "k1", "k2"]


def _audit(url: str, key: str, **params: Any) -> list[dict[str, Any]]:
    with _client(url, key) as c:
        answer = c.get("/audit", params=params)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


def test_the_audit_log_is_one_for_the_cluster(lay: Layout) -> None:
    team = _team(lay, "audited")
    a, b, c = (n.url for n in lay.nodes)
    with _client(lay.gateways[0].url, team["apiKey"]) as t:
        ci = t.post("/api-keys", json={"name": "ci"}).json()["key"]
    # On A: a sandbox made and killed; on C: a secret made. Nothing on B.
    with _client(a, ci) as on_a:
        made = on_a.post("/sandboxes", json={"templateID": "base", "timeout": 120})
        assert made.status_code == 201, made.text
        sandbox = made.json()["sandboxID"]
        assert on_a.delete(f"/sandboxes/{sandbox}").status_code == 204
    with _client(c, ci) as on_c:
        assert on_c.post("/secrets", json={"name": "audited", "value": "v"}
                         ).status_code == 201
    wanted = {("POST /api-keys", "default"), ("POST /sandboxes", "ci"),
              ("DELETE /sandboxes/{sandbox_id}", "ci"), ("POST /secrets", "ci")}
    deadline = time.monotonic() + FLUSHED_S
    while True:
        mine = _audit(b, team["apiKey"], limit=100)
        seen = [(e["action"], e["keyName"]) for e in mine]
        if set(seen) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # In the order they were written: each node's in its own order, the nodes' interleaved
    # by when each flushed (``at`` is when each was answered).
    assert sorted(seen) == sorted(wanted), seen
    assert seen.index(("DELETE /sandboxes/{sandbox_id}", "ci")) < \
        seen.index(("POST /sandboxes", "ci"))
    assert {e["objectID"] for e in mine if "sandboxes" in e["action"]} == {sandbox}
    for entry in mine:
        assert entry["teamID"] == team["teamID"] and entry["status"] in (201, 204), entry
    seqs = [e["seq"] for e in mine]
    assert seqs == sorted(set(seqs), reverse=True)
    # The same log on every node and the gateway, by object and page by page.
    for url in (a, c, lay.gateways[0].url):
        by_object = _audit(url, team["apiKey"], object=sandbox)
        assert [e["action"] for e in by_object] == ["DELETE /sandboxes/{sandbox_id}",
                                                    "POST /sandboxes"], url
    first = _audit(c, team["apiKey"], limit=2)
    after = _audit(a, team["apiKey"], limit=2, before=first[-1]["seq"])
    assert [e["seq"] for e in first + after] == seqs[:4]
    # Another team's key reads none of it; the operator's reads it all.
    other = _team(lay, "audited-not")["apiKey"]
    assert all(e["teamID"] != team["teamID"] for e in _audit(b, other, limit=1000))
    assert {e["seq"] for e in mine} <= {e["seq"] for e in _audit(b, API_KEY, limit=1000)}


def test_the_gateways_own_refusals_are_in_the_log(lay: Layout) -> None:
    """A create through the gateway with a key it does not know is refused there (401),
    never reaching a node: the gateway writes that refusal into the cluster's log."""
    bad = "e2b_" + "0" * 40
    with _client(lay.gateways[0].url, bad) as stranger:
        refused = stranger.post("/sandboxes", json={"templateID": "base"})
        assert refused.status_code == 401, refused.text
        assert stranger.delete("/sandboxes/nope12345").status_code == 401
    actor = "key:" + hashlib.sha256(bad.encode()).hexdigest()[:12]
    deadline = time.monotonic() + FLUSHED_S
    while True:
        found = [(e["action"], e["status"], e["objectID"])
                 for e in _audit(lay.nodes[1].url, API_KEY, actor=actor)]
        if len(found) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted(found) == [("DELETE /sandboxes/nope12345", 401, "nope12345"),
                             ("POST /sandboxes", 401, None)], found


def _unavailable(answer: httpx.Response) -> None:
    assert answer.status_code == 503, (answer.status_code, answer.text)
    body = answer.json()
    assert body["code"] == 503 and isinstance(body["message"], str), body


def test_redis_down_is_503_never_500_and_back_it_serves_again(lay: Layout) -> None:
    """Last in the module: Redis comes back empty (no persistence)."""
    lay.redis.kill()
    try:
        for node in lay.nodes:
            # The operator key is known without Redis: what answers is the store.
            with _client(node.url, API_KEY) as op:
                _unavailable(op.get("/secrets"))
                _unavailable(op.get("/secrets/anything"))
                _unavailable(op.post("/secrets", json={"name": "down", "value": "v"}))
                _unavailable(op.post("/secrets/anything", json={"value": "v"}))
                _unavailable(op.delete("/secrets/anything"))
                _unavailable(op.get("/audit"))
        with _client(lay.gateways[0].url, API_KEY) as op:
            _unavailable(op.get("/secrets"))
            _unavailable(op.get("/audit"))
    finally:
        lay.redis.start()
    # Back (empty): the nodes write and read it again at once.
    with _client(lay.nodes[0].url, API_KEY) as op:
        assert op.post("/secrets", json={"name": "back", "value": "v"}).status_code == 201
    deadline = time.monotonic() + FLUSHED_S
    while not any(e["action"] == "POST /secrets" and e["status"] == 201
                  for e in _audit(lay.nodes[1].url, API_KEY)):
        assert time.monotonic() < deadline, "the log did not come back"
        time.sleep(0.2)
    with _client(lay.nodes[2].url, API_KEY) as op:
        assert [s["name"] for s in op.get("/secrets").json()] == ["back"]
    for node in lay.nodes:
        ours = [t for t in _tracebacks(node.log())
                if any(m in t for m in ("audit", "secret", "Vault"))]
        assert not ours, ours[0]


def _tracebacks(log: str) -> list[str]:
    """Each traceback of a node's log, with the line that logged it."""
    blocks, lines = [], log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j][:2] == "20"),
                       len(lines))
            blocks.append("\n".join(lines[max(i - 1, 0):end]))
    return blocks
