"""Lifecycle webhooks (docs/webhooks.md) against a real HTTP receiver on this machine, the
node with the fake runtime: every event of a sandbox's life arrives signed as E2B signs
(the receiver checks each signature), with the payload's fields; the receiver down for 30 s,
then the delivery arrives with the id its log showed; the node killed with SIGKILL while a
delivery is being retried, then restarted, then the delivery arrives with the same id.
Another team sees none of a team's webhooks; the secret is never shown."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from tests.server.harness import API_KEY, NodeServer, cleanup_home, kill_leaked, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
SECRET = "whsec-0123456789"
SETTINGS = {"runtime": "fake", "net_pool_size": "2", "warm_pool_size": "0",
            "webhook_allow_private": "true", "webhook_retry_max_s": "3"}


class Receiver:
    """A real HTTP server on 127.0.0.1 that keeps what it is sent; ``status`` is what it
    answers; ``stop``/``start`` take it down and up on the same port."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                owner.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(owner.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def events(self) -> list[dict[str, Any]]:
        """What arrived, each signature checked as a receiver following E2B's docs does."""
        out = []
        for headers, body in self.got:
            expected = base64.b64encode(hashlib.sha256(SECRET.encode() + body).digest()
                                        ).decode().rstrip("=")
            assert headers["e2b-signature"] == expected, headers
            assert headers["e2b-signature-version"] == "v1"
            out.append({**json.loads(body), "_delivery": headers["e2b-delivery-id"],
                        "_webhook": headers["e2b-webhook-id"]})
        return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    made.start()
    try:
        yield made
    finally:
        made.stop()


@contextlib.contextmanager
def _node(home: Path | None = None, port: int | None = None,
          slots: dict[str, str] | None = None) -> Iterator[NodeServer]:
    server = start_server(port or free_port(), home, **SETTINGS, **(slots or {}))
    try:
        yield server
    finally:
        server.stop()
        kill_leaked(server.home)


def _api(node: NodeServer, key: str = API_KEY) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": key}, timeout=60)


def _register(api: httpx.Client, url: str, **more: Any) -> dict[str, Any]:
    made = api.post("/events/webhooks", json={"name": "rl", "url": url, "enabled": True,
                                              "signatureSecret": SECRET, **more})
    assert made.status_code == 201, made.text
    assert SECRET not in made.text
    hook: dict[str, Any] = made.json()
    return hook


def _until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.3)


def test_every_event_arrives_signed(receiver: Receiver) -> None:
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    try:
        with _node(home) as node, _api(node) as api:
            hook = _register(api, receiver.url)
            assert set(hook) == {"id", "teamID", "name", "createdAt", "enabled", "url",
                                 "events"}
            sid = api.post("/sandboxes", json={"templateID": "base",
                                               "metadata": {"run": "r1"}}).json()["sandboxID"]
            assert api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 120}
                            ).status_code == 204
            assert api.post(f"/sandboxes/{sid}/pause").status_code == 204
            assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}
                            ).status_code in (200, 201)
            assert api.post(f"/sandboxes/{sid}/snapshots", json={}).status_code == 201
            assert api.delete(f"/sandboxes/{sid}").status_code == 204
            wanted = ["created", "updated", "paused", "resumed", "checkpointed", "killed"]
            events = _until("six events", lambda: (e := receiver.events())
                            and len(e) >= 6 and e)
            assert [e["type"] for e in events] == [f"sandbox.lifecycle.{t}" for t in wanted]
            first, last = events[0], events[-1]
            assert first["version"] == "v2" and first["sandboxId"] == sid
            assert first["eventData"]["sandbox_metadata"] == {"run": "r1"}
            assert first["sandboxTemplateId"] and first["sandboxTeamId"]
            assert first["_webhook"] == hook["id"]
            assert last["eventData"]["execution"]["memory_mb"] > 0
            assert len({e["_delivery"] for e in events}) == len({e["id"] for e in events}) == 6
            log = api.get(f"/events/webhooks/{hook['id']}/deliveries").json()
            assert {d["status"] for d in log} == {"delivered"}
            assert {d["deliveryID"] for d in log} == {e["_delivery"] for e in events}

            # Filters and state: only the events asked for; a disabled webhook gets none.
            only = api.patch(f"/events/webhooks/{hook['id']}",
                             json={"events": ["sandbox.lifecycle.killed"]})
            assert only.status_code == 200 and only.json()["events"] == [
                "sandbox.lifecycle.killed"]
            before = len(receiver.got)
            sid2 = api.post("/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
            api.delete(f"/sandboxes/{sid2}")
            _until("the kill", lambda: len(receiver.got) == before + 1)
            time.sleep(1.5)
            assert receiver.events()[-1]["type"] == "sandbox.lifecycle.killed"
            assert len(receiver.got) == before + 1

            # Another team: none of these; bad input: 400.
            other = api.post("/teams", json={"name": "hooks-other"}).json()["apiKey"]
            with _api(node, other) as them:
                assert them.get("/events/webhooks").json() == []
                for method in ("GET", "PATCH", "DELETE"):
                    refused = them.request(method, f"/events/webhooks/{hook['id']}",
                                           json={} if method == "PATCH" else None)
                    assert refused.status_code == 404, (method, refused.text)
            for bad in ({"name": "x", "url": "ftp://h/"}, {"name": "x", "url": receiver.url,
                                                         "events": ["sandbox.nope"]},
                        {"name": "", "url": receiver.url}):
                assert api.post("/events/webhooks", json=bad).status_code == 400, bad
            listed = api.get("/events/webhooks").json()
            assert [h["id"] for h in listed] == [hook["id"]] and SECRET not in str(listed)
            assert api.delete(f"/events/webhooks/{hook['id']}").status_code == 204
            assert api.get(f"/events/webhooks/{hook['id']}").status_code == 404
    finally:
        cleanup_home(home)


def test_a_receiver_down_30_s_then_a_node_killed_mid_retry(receiver: Receiver) -> None:
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    port = free_port()
    try:
        with _node(home, port) as node, _api(node) as api:
            slots = {k: node.env[f"AENV_{k.upper()}"]
                     for k in ("net_first_index", "net_last_index")}
            hook = _register(api, receiver.url, events=["sandbox.lifecycle.created"])
            receiver.stop()  # down: connections refused
            api.post("/sandboxes", json={"templateID": "base"})
            log = _until("a failed try", lambda: [
                d for d in api.get(f"/events/webhooks/{hook['id']}/deliveries").json()
                if d["attempts"] >= 1])
            delivery = log[0]["deliveryID"]
            assert log[0]["status"] == "pending" and log[0]["lastError"]
            time.sleep(30)
            receiver.start()
            _until("the delivery", lambda: receiver.got, timeout=15)
            assert receiver.events()[0]["_delivery"] == delivery
            tries = api.get(f"/events/webhooks/{hook['id']}/deliveries").json()[0]
            assert tries["status"] == "delivered" and tries["attempts"] > 3, tries

            # Now it answers 503: tried again and again, until the node is killed.
            receiver.status = 503
            api.post("/sandboxes", json={"templateID": "base"})
            retried = _until("a retried delivery", lambda: [
                d for d in api.get(f"/events/webhooks/{hook['id']}/deliveries").json()
                if d["status"] == "pending" and d["attempts"] >= 2])
            pending = retried[0]["deliveryID"]
            node.kill9()
        seen = len(receiver.got)
        receiver.status = 200
        with _node(home, port, slots) as again, _api(again) as api:
            _until("the delivery after the restart", lambda: len(receiver.got) > seen,
                   timeout=30)
            assert receiver.events()[-1]["_delivery"] == pending
            done = {d["deliveryID"]: d for d in
                    api.get(f"/events/webhooks/{hook['id']}/deliveries").json()}
            assert done[pending]["status"] == "delivered"
            for info in api.get("/v2/sandboxes").json():
                api.delete(f"/sandboxes/{info['sandboxID']}")
    finally:
        cleanup_home(home)
        shutil.rmtree(home, ignore_errors=True)
