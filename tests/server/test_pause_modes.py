"""What a pause reports and honours: ``pauseMode``, ``requireHealthyGuest``,
``envdUnresponsiveAtPause`` (e2b-compat §2.4.7, §2.4.3).

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import time

import httpx
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer


def _raw(server: NodeServer, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers={"X-API-KEY": API_KEY},
                         timeout=60, **kw)  # type: ignore[arg-type]

def test_a_pause_reports_its_mode_and_a_strict_one_needs_a_healthy_guest(
    server: NodeServer,
) -> None:
    sbx = Sandbox.create(timeout=300)
    sid = sbx.sandbox_id
    assert "pauseMode" not in _raw(server, "GET", f"/sandboxes/{sid}").json()
    # Filesystem-only and strict, on a healthy guest: paused, files only with disk workspaces,
    # in full where the files live in memory.
    paused = _raw(server, "POST", f"/sandboxes/{sid}/pause",
                  json={"memory": False, "requireHealthyGuest": True})
    assert paused.status_code == 204, paused.text
    info = _raw(server, "GET", f"/sandboxes/{sid}").json()
    assert info["state"] == "paused"
    on_disk = server.env.get("AENV_WORKSPACE", "disk") == "disk"
    assert info["pauseMode"] == ("filesystem" if on_disk else "full")
    assert info["envdUnresponsiveAtPause"] is False
    sbx = Sandbox.connect(sid, timeout=300)

    # A guest whose envd does not answer: a strict pause is refused, a plain one goes ahead.
    envd = sbx.commands.run("pgrep -o -f 'envd' || pgrep -o python3", user="root").stdout
    sbx.commands.run(f"nohup sh -c 'sleep 0.5; kill -STOP {envd.split()[0]}' >/dev/null 2>&1 &",
                     user="root")

    time.sleep(1.5)
    refused = _raw(server, "POST", f"/sandboxes/{sid}/pause", json={"requireHealthyGuest": True})
    assert refused.status_code == 409, refused.text
    assert "envd does not answer" in refused.json()["message"]
    assert _raw(server, "GET", f"/sandboxes/{sid}").json()["state"] == "running"
    assert _raw(server, "POST", f"/sandboxes/{sid}/pause", json={}).status_code == 204
    info = _raw(server, "GET", f"/sandboxes/{sid}").json()
    assert info["pauseMode"] == "full" and info["envdUnresponsiveAtPause"] is True
    Sandbox.kill(sid)


def test_a_timeout_pause_without_memory_keeps_only_the_files(server: NodeServer) -> None:
    """E2B's ``lifecycle={"on_timeout": {"action": "pause", "keep_memory": False}}``: the
    pause at the end of the lifetime keeps the files, and the resume is a new boot (E2B's own
    SDK test checks the boot id). It used to keep the memory: the same boot id came back."""
    on_disk = server.env.get("AENV_WORKSPACE", "disk") == "disk"
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": {"action": "pause",
                                                              "keep_memory": False}})
    boot_id = sbx.files.read("/proc/sys/kernel/random/boot_id")
    sbx.files.write("/home/user/kept", "files survive")
    deadline = time.monotonic() + 30
    while sbx.get_info().state.value != "paused" and time.monotonic() < deadline:
        time.sleep(0.2)
    info = _raw(server, "GET", f"/sandboxes/{sbx.sandbox_id}").json()
    assert info["state"] == "paused", info
    assert info["pauseMode"] == ("filesystem" if on_disk else "full")
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert resumed.files.read("/home/user/kept") == "files survive"
    if on_disk:
        assert resumed.files.read("/proc/sys/kernel/random/boot_id") != boot_id
    resumed.kill()
