"""Overlapping lifecycle calls on one sandbox: it always settles, and kill always wins
(issue 21, item 1; docs/lifecycle.md, *The lifecycle model*).

Before the sandbox owners (``orchestrator/owners.py``) these wedged a sandbox for good: seven
requests at once on a paused sandbox left it ``pausing`` with every kill answering 409 after
30 s; a timeout written during a spill made the spill's write conflict and the sandbox stayed
``pausing``; one written during a resume left it ``resuming``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer, serving

#: Every sandbox settles this soon after its last call (a spill or resume here takes < 2 s).
SETTLE_S = 30.0
#: A kill answers within this, whatever holds the sandbox (the issue's bound).
KILL_S = 5.0


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    # A short hot period: the spill to disk runs while the calls below overlap it.
    with serving(pause_hot_s="0.3") as server:
        yield server


def _api(node: NodeServer) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}, timeout=60)


def _settled(api: httpx.Client, sandbox_id: str) -> dict[str, object] | None:
    """The sandbox's info once no operation holds it and its state is stable (None: gone)."""
    deadline = time.monotonic() + SETTLE_S
    info: dict[str, object] = {}
    while time.monotonic() < deadline:
        r = api.get(f"/sandboxes/{sandbox_id}")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        info = r.json()
        now = info["aenv"]
        assert isinstance(now, dict)
        if now["state"] in ("running", "paused") and now.get("operation") is None:
            return info
        time.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} did not settle: {info}")


def _kill_in_time(api: httpx.Client, sandbox_id: str) -> None:
    started = time.monotonic()
    r = api.delete(f"/sandboxes/{sandbox_id}")
    took = time.monotonic() - started
    assert r.status_code in (204, 404), r.text
    assert took < KILL_S, f"kill took {took:.1f} s"
    assert api.get(f"/sandboxes/{sandbox_id}").status_code == 404


def _seven(api: httpx.Client, sid: str) -> list[httpx.Response]:
    calls = [
        lambda: api.post(f"/sandboxes/{sid}/resume", json={"timeout": 60}),
        lambda: api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}),
        lambda: api.post(f"/sandboxes/{sid}/pause"),
        lambda: api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 0}),
        lambda: api.post(f"/sandboxes/{sid}/refreshes", json={"duration": 60}),
        lambda: api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 60}),
        lambda: api.post(f"/sandboxes/{sid}/snapshots", json={}),
    ]
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


@pytest.mark.parametrize("paused_on", ["memory", "disk"])
def test_seven_requests_at_once_on_a_paused_sandbox(node: NodeServer, paused_on: str) -> None:
    with _api(node) as api:
        for _ in range(3):
            sbx = Sandbox.create(timeout=120)
            sbx.files.write("/home/user/kept", "the same bytes")
            sbx.pause()
            if paused_on == "disk":
                time.sleep(1.5)  # past the hot period: the spill has written it out
            answers = _seven(api, sbx.sandbox_id)
            assert all(r.status_code < 500 for r in answers), \
                [(r.status_code, r.text) for r in answers]
            info = _settled(api, sbx.sandbox_id)
            if info is not None and info["state"] == "running":
                # Whichever call won, the sandbox works and kept its files.
                assert sbx.files.read("/home/user/kept") == "the same bytes"
            _kill_in_time(api, sbx.sandbox_id)


def test_timeouts_written_during_a_spill_and_a_resume_do_not_wedge_it(node: NodeServer
                                                                        ) -> None:
    with _api(node) as api:
        sbx = Sandbox.create(timeout=120)
        data = hashlib.sha256(b"x").hexdigest()
        sbx.files.write("/home/user/kept", data)
        for _ in range(3):
            sbx.pause()
            # The spill starts 0.3 s after the pause; keep the end time changing through it.
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: api.post(f"/sandboxes/{sbx.sandbox_id}/timeout",
                                                 json={"timeout": 120}), range(40)))
            info = _settled(api, sbx.sandbox_id)
            assert info is not None and info["state"] == "paused"
            # A resume from disk with the end time changing under it.
            with ThreadPoolExecutor(4) as pool:
                resumed = pool.submit(
                    api.post, f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 120})
                list(pool.map(lambda _: api.post(f"/sandboxes/{sbx.sandbox_id}/refreshes",
                                                 json={"duration": 120}), range(40)))
                assert resumed.result().status_code in (200, 201), resumed.result().text
            info = _settled(api, sbx.sandbox_id)
            assert info is not None and info["state"] == "running"
            assert sbx.files.read("/home/user/kept") == data
        _kill_in_time(api, sbx.sandbox_id)


@pytest.mark.parametrize("operation", ["pause", "snapshot", "fork", "resume"])
def test_kill_wins_over_an_operation_in_flight(node: NodeServer, operation: str) -> None:
    with _api(node) as api:
        before = {s["sandboxID"] for s in api.get("/v2/sandboxes").json()}
        sbx = Sandbox.create(timeout=120)
        sid = sbx.sandbox_id
        if operation == "resume":
            sbx.pause()
            time.sleep(1.5)  # on disk: the resume is a restore, long enough to be preempted
        paths = {"pause": f"/sandboxes/{sid}/pause", "snapshot": f"/sandboxes/{sid}/snapshots",
                 "fork": f"/sandboxes/{sid}/fork", "resume": f"/sandboxes/{sid}/resume"}
        bodies: dict[str, object] = {"fork": {"count": 2}, "snapshot": {},
                                     "resume": {"timeout": 60}}
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(api.post, paths[operation], json=bodies.get(operation))
            time.sleep(0.05)
            _kill_in_time(api, sid)
            assert held.result().status_code < 500 or held.result().status_code == 504, \
                held.result().text
        children = [e["sandbox"]["sandboxID"] for e in held.result().json()
                    if isinstance(e, dict) and "sandbox" in e] \
            if operation == "fork" and held.result().status_code == 201 else []
        for child in children:
            _kill_in_time(api, child)
        # Nothing of it is left, and no child of a fork the kill cut short.
        time.sleep(1)
        listed = {s["sandboxID"] for s in api.get("/v2/sandboxes").json()}
        assert listed <= before, listed - before
