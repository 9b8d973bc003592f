"""kill -9 of the server at each step of pause, snapshot, repository commit and GC.

The server is restarted with ``crash_at=<step>`` (``core/faults.py``): it kills itself with
SIGKILL exactly there. After a second restart (no crash point):

- the sandbox is listed, running or paused, and has its files (a paused one resumes);
- nothing is left in ``<home>/staging/`` (a snapshot answered before the crash, whose commit
  it cut short, is committed by the restart);
- every manifest in the repository is complete (each blob it names exists) and every listed
  snapshot starts a sandbox with the source's files — no partial snapshot is visible;
- a sandbox paused to disk is (again) in the repository, so another node could resume it;
- after a GC cut short, a GC pass finishes the job and keeps what is referenced.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxNotFoundException

from tests.server.crash_node import MARK, CrashableNode, crashable, entries_of, live_sandboxes
from tests.server.harness import API_KEY

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = [
    ("pause", "spill.checkpointed"),
    ("pause", "spill.sealed"),
    ("pause", "spill.destroyed"),
    ("pause", "commit.paused.blobs"),
    ("pause", "commit.paused.manifest"),
    ("snapshot", "snapshot.checkpointed"),
    ("snapshot", "commit.snapshot.blobs"),
    ("snapshot", "commit.snapshot.manifest"),
    ("gc", "gc.planned"),
    ("gc", "gc.deleted"),
]


def _gc(node: CrashableNode) -> httpx.Response:
    return httpx.post(f"{node.server.url}/repository/gc", headers={"X-API-KEY": API_KEY},
                      timeout=60)


def _manifests(home: Path) -> dict[str, dict[str, object]]:
    root = home / "repository" / "manifests"
    return {p.stem: json.loads(p.read_text()) for p in root.glob("*.json")}


def _missing_blobs(home: Path) -> dict[str, list[str]]:
    """For each manifest, the blobs it names that the repository lacks."""
    blobs = home / "repository" / "blobs" / "sha256"
    missing: dict[str, list[str]] = {}
    for name, manifest in _manifests(home).items():
        digests = [layer["digest"] for layer in manifest["layers"]]  # type: ignore[attr-defined]
        digests += [f["digest"] for f in manifest["memory"]]  # type: ignore[attr-defined]
        digests.append(manifest["envd_bundle"]["digest"])  # type: ignore[index]
        gone = [d for d in digests if not (blobs / d.removeprefix("sha256:")).is_file()]
        if gone:
            missing[name] = gone
    return missing


def _wait_exit(node: CrashableNode, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while node.server.process.poll() is None:
        assert time.monotonic() < deadline, "the server did not reach its crash point"
        time.sleep(0.05)


@pytest.mark.parametrize(("operation", "step"), STEPS, ids=[s for _, s in STEPS])
def test_kill9_at_each_step_loses_nothing(operation: str, step: str) -> None:
    # The set-up takes snapshots, so a snapshot's crash points are armed by a restart after
    # it; nothing before the operation reaches a pause's or a GC's, which the first start
    # arms (one start fewer: the suite's 30 minutes).
    armed = {} if operation == "snapshot" else {"crash_at": step}
    with crashable(pause_hot_s="0", gc_grace_s="0", gc_interval_s="0", **armed) as node:
        sbx = Sandbox.create(timeout=600)
        sbx.files.write(MARK, "before")
        kept = sbx.create_snapshot()
        if operation == "gc":
            doomed = sbx.create_snapshot()
            Sandbox.delete_snapshot(doomed.snapshot_id)
        if not armed:
            node.server.stop()  # the sandbox keeps running; the next start re-attaches it
            node.settings["crash_at"] = step
            node.restart()
        del node.settings["crash_at"]
        with ThreadPoolExecutor(1) as pool:
            if operation == "pause":
                call = pool.submit(Sandbox.pause, sbx.sandbox_id)
            elif operation == "snapshot":
                call = pool.submit(Sandbox.connect(sbx.sandbox_id).create_snapshot)
            else:
                call = pool.submit(_gc, node)
            _wait_exit(node)
            failure = call.exception(timeout=60)  # ended one way or the other; never hangs
        node.restart()

        listed = live_sandboxes()
        assert sbx.sandbox_id in listed, listed
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert resumed.files.read(MARK) == "before"
        # A listing waits for the commits a crash interrupted after their answer.
        snapshots = [s.snapshot_id for s in Sandbox.list_snapshots(limit=100).next_items()]
        assert kept.snapshot_id in snapshots
        if operation == "snapshot" and failure is None:
            # Answered before the crash (the commit runs after the answer): it is kept.
            assert call.result().snapshot_id in snapshots, (step, snapshots)
        assert entries_of(node.staging) == []
        assert _missing_blobs(node.home) == {}
        for snapshot_id in snapshots:
            child = Sandbox.create(snapshot_id, timeout=120)
            assert child.files.read(MARK) == "before"
            child.kill()
        if operation == "gc":
            assert _gc(node).status_code == 200
            assert _missing_blobs(node.home) == {}
        if operation == "pause":
            resumed.pause()
            deadline = time.monotonic() + 60
            while f"paused-{sbx.sandbox_id}" not in _manifests(node.home):
                assert time.monotonic() < deadline, "the paused sandbox never reached the repo"
                time.sleep(0.2)
            assert _missing_blobs(node.home) == {}


def test_kill9_mid_kill_of_a_paused_sandbox_leaves_nothing_to_resume() -> None:
    """A kill cut short by the crash is finished by the restart as the kill would have:
    the paused sandbox's manifest goes too (torture: it outlived the record, and a later
    kill answered 204 for a sandbox the node had said was gone)."""
    with crashable(pause_hot_s="0", crash_at="kill.marked") as node:
        sbx = Sandbox.create(timeout=600)
        sbx.files.write(MARK, "before")
        sbx.pause()
        deadline = time.monotonic() + 60
        while f"paused-{sbx.sandbox_id}" not in _manifests(node.home):
            assert time.monotonic() < deadline, "the paused sandbox never reached the repo"
            time.sleep(0.2)
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(Sandbox.kill, sbx.sandbox_id)
            _wait_exit(node)
            assert call.exception(timeout=60) is not None  # the node died under it
        del node.settings["crash_at"]
        node.restart()

        assert sbx.sandbox_id not in live_sandboxes()
        assert f"paused-{sbx.sandbox_id}" not in _manifests(node.home)
        assert Sandbox.kill(sbx.sandbox_id) is False  # 404: gone, as the first kill said
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sbx.sandbox_id, timeout=60)
