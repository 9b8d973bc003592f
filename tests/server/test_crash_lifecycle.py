"""kill -9 of the server in the middle of a pause, a snapshot or a fork, then a restart on the
same home: recovery must leave nothing lost and nothing half-made.

Each scenario starts an operation in a thread, kills the server while it is in flight (the
trigger is the operation's own footprint, on disk or in the server log, so the kill lands
inside it whatever the machine's speed), restarts, and checks the invariants of
``orchestrator/recover.py`` from the outside, whichever branch the kill hit:

- every sandbox that existed (was acknowledged) is still listed, running or paused; an
  acknowledged pause stays paused; each one works (commands run with its original access
  token, its files are intact), a paused one after ``Sandbox.connect`` resumes it;
- every sandbox listed works (e.g. a fork child the crash interrupted is either gone or whole);
- ``list_snapshots`` shows every acknowledged snapshot and only complete ones: each listed
  snapshot starts a sandbox that has the source's files;
- nothing is left in ``<home>/staging/``; ``<home>/paused/`` holds only images of paused
  sandboxes (no ``.partial``);
- no runsc process outlives the final stop.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox, SandboxState

from aenv.runtime import urpc
from tests.server.crash_node import (
    MARK,
    CrashableNode,
    crashable,
    entries_of,
    live_sandboxes,
    outcomes_of,
    snapshot_ids,
    wait_for,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

def _with_mark(mark: str) -> Sandbox:
    sbx = Sandbox.create(timeout=600)
    sbx.files.write(MARK, mark)
    return sbx


def _settle_spills(node: CrashableNode, timeout: float = 60.0) -> None:
    """With ``pause_hot_s=0`` recovery re-schedules the spill of every sandbox it found
    frozen; let those finish (the log line comes after the runtime is freed) so the checks see
    a quiet node."""
    log = node.log_since_restart()
    frozen = re.findall(r"re-attached sandbox (\w+) \(frozen\)", log)

    def quiet() -> bool:
        text = node.log_since_restart()
        return (not any(e.endswith(".partial") for e in entries_of(node.paused_dir))
                and all(f"paused {sid} to disk" in text for sid in frozen))

    with contextlib.suppress(TimeoutError):
        wait_for(quiet, timeout, "the re-scheduled spills")


def check_recovered(
    node: CrashableNode,
    acknowledged: dict[str, Sandbox],
    marks: dict[str, str],
    *,
    paused: set[str] | None = None,
    snapshots: dict[str, str] | None = None,
    snapshot_mark: str | None = None,
    unacknowledged_mark: str | None = None,
) -> None:
    """Assert the invariants after a crash and restart (see the module docstring).

    ``acknowledged``: sandboxes the client was told exist, as its original handles (with the
    access token it was given); ``marks``: the content of ``MARK`` in each; ``paused``: those
    whose pause was acknowledged; ``snapshots``: acknowledged snapshot → the mark sandboxes
    made from it have; ``snapshot_mark``: the mark of a snapshot committed but never
    acknowledged (None: there must be none); ``unacknowledged_mark``: the mark of a sandbox
    the client never heard of, e.g. a fork child of a fork the crash cut short (None: there
    must be none).
    """
    # Nothing half-written survives a restart: the repository sweeps staging at start, and
    # finishes the commits of snapshots answered before the crash in the background.
    wait_for(lambda: entries_of(node.staging) == [], 30, "staging emptied after the restart")
    _settle_spills(node)

    listed = live_sandboxes()
    lost = set(acknowledged) - set(listed)
    assert not lost, f"sandboxes lost in the crash: {lost} (listed: {listed})"
    for sid in paused or ():
        assert listed[sid] == SandboxState.PAUSED, f"the acknowledged pause of {sid} was undone"
    if unacknowledged_mark is None:
        assert set(listed) == set(acknowledged), "sandboxes nobody created are listed"

    # Memory images belong to paused sandboxes only, and none is half-made.
    images = entries_of(node.paused_dir)
    assert not [e for e in images if e.endswith(".partial")], images
    strays = {e for e in images if listed.get(e) != SandboxState.PAUSED}
    assert not strays, f"memory images of no paused sandbox: {strays}"

    for sid, state in listed.items():
        again = Sandbox.connect(sid, timeout=600, retries=0)  # resumes a paused one
        handle = acknowledged.get(sid, again)
        # Same access token as before the crash: the original handle still opens it.
        assert again._envd_access_token == handle._envd_access_token, sid
        assert handle.files.read(MARK) == marks.get(sid, unacknowledged_mark), (sid, state)
        assert handle.commands.run("echo ok", timeout=30).stdout == "ok\n", (sid, state)
        assert Sandbox.get_info(sid).state == SandboxState.RUNNING, sid

    listed_snapshots = snapshot_ids()
    missing = set(snapshots or {}) - set(listed_snapshots)
    assert not missing, f"acknowledged snapshots lost: {missing}"
    if snapshot_mark is None:
        assert set(listed_snapshots) == set(snapshots or {}), "snapshots nobody took are listed"
    for snapshot_id in listed_snapshots:
        child = Sandbox.create(snapshot_id, timeout=60)
        try:
            expected = (snapshots or {}).get(snapshot_id, snapshot_mark)
            assert child.files.read(MARK) == expected, snapshot_id
            assert child.commands.run("echo ok", timeout=30).stdout == "ok\n", snapshot_id
        finally:
            child.kill()


# -- scenarios --------------------------------------------------------------------------------


def _new_staging(node: CrashableNode, before: set[str], prefix: str = "") -> list[str]:
    return [e for e in entries_of(node.staging) if e not in before and e.startswith(prefix)]


Trigger = Callable[[CrashableNode, set[str], str, Future[Any]], None]


def _mid_checkpoint(node: CrashableNode, before: set[str], prefix: str,
                    call: Future[Any]) -> None:
    """The staging directory appears just before ``runsc checkpoint`` starts writing into it;
    a save takes a few hundred ms."""
    wait_for(lambda: bool(_new_staging(node, before, prefix)), 20, "the staging directory", call)
    time.sleep(0.05)


def _mid_commit(node: CrashableNode, before: set[str], prefix: str,
                call: Future[Any]) -> None:
    """``manifest.json`` is written once the image is complete, just before the staged tree
    is fsynced and renamed into the repository (if that was quicker than the poll, the kill
    lands right after the commit, which must then survive)."""
    seen: set[str] = set()

    def manifest_or_renamed() -> bool:
        staged = _new_staging(node, before, prefix)
        if seen - set(staged):
            return True  # renamed away between two looks
        seen.update(staged)
        return any((node.staging / e / "manifest.json").exists() for e in staged)

    wait_for(manifest_or_renamed, 20, "the commit", call)


def test_kill9_during_snapshot() -> None:
    with crashable(warm_pool_size="0") as node:
        source = _with_mark("snapshot-source")
        bystander = _with_mark("bystander")
        first = source.create_snapshot()  # committed before any crash: must survive them
        sandboxes = {source.sandbox_id: source, bystander.sandbox_id: bystander}
        marks = {source.sandbox_id: "snapshot-source", bystander.sandbox_id: "bystander"}
        acked = {first.snapshot_id: "snapshot-source"}

        kill_whens: list[Trigger] = [_mid_checkpoint, _mid_commit]
        for kill_when in kill_whens:
            before = set(entries_of(node.staging))
            with ThreadPoolExecutor(1) as pool:
                call = pool.submit(source.create_snapshot)
                kill_when(node, before, "snap", call)
                node.kill9()
                [outcome] = outcomes_of([call])
            node.restart()
            if not isinstance(outcome, BaseException):
                acked[outcome.snapshot_id] = "snapshot-source"
            check_recovered(node, sandboxes, marks, snapshots=acked,
                            snapshot_mark="snapshot-source")


def _first_child_restored(node: CrashableNode, before: set[str], prefix: str,
                          call: Future[Any]) -> None:
    """Past the checkpoint, into the children's restores (no warm pool: every restore logged
    from now on is a child's; the others are still restoring)."""
    wait_for(lambda: bool(_new_staging(node, before, prefix)), 20, "the fork's staging", call)
    offset = len(node.server.log())
    wait_for(lambda: "restored sandbox" in node.server.log()[offset:], 20, "a child", call)


def test_kill9_during_fork() -> None:
    with crashable(warm_pool_size="0") as node:
        source = _with_mark("fork-source")
        acknowledged = {source.sandbox_id: source}

        kill_whens: list[Trigger] = [_mid_checkpoint, _first_child_restored]
        for kill_when in kill_whens:
            before = set(entries_of(node.staging))
            with ThreadPoolExecutor(1) as pool:
                call = pool.submit(source.fork, count=4, timeout=600)
                kill_when(node, before, "fork-", call)
                node.kill9()
                [outcome] = outcomes_of([call])
            node.restart()
            if not isinstance(outcome, BaseException):
                acknowledged.update({c.sandbox_id: c for c in outcome if isinstance(c, Sandbox)})
            check_recovered(node, acknowledged, {sid: "fork-source" for sid in acknowledged},
                            unacknowledged_mark="fork-source")


def _mid_spill(node: CrashableNode) -> None:
    """pause answers once frozen; with ``pause_hot_s=0`` the spill starts at once and
    checkpoints into ``<id>.partial``: kill once a checkpoint is writing there (the other
    sandboxes' spills are wherever they are then: not started, starting, writing)."""

    def writing() -> bool:
        return any(e.endswith(".partial") and (node.paused_dir / e / "checkpoint.img").exists()
                   for e in entries_of(node.paused_dir))

    wait_for(writing, 20, "a spill's checkpoint")


def test_kill9_during_pause_spill() -> None:
    with crashable(pause_hot_s="0") as node:
        sandboxes = [_with_mark(f"paused-{i}") for i in range(3)]
        bystander = _with_mark("bystander")
        marks = {s.sandbox_id: f"paused-{i}" for i, s in enumerate(sandboxes)}
        marks[bystander.sandbox_id] = "bystander"

        with ThreadPoolExecutor(len(sandboxes)) as pool:
            calls = [pool.submit(s.pause) for s in sandboxes]
            _mid_spill(node)
            node.kill9()
            outcomes = outcomes_of(calls)

        node.restart()
        acked_paused = {s.sandbox_id for s, o in zip(sandboxes, outcomes, strict=True)
                        if o is True}
        check_recovered(node, {s.sandbox_id: s for s in [*sandboxes, bystander]}, marks,
                        paused=acked_paused)


def _pause_marker(node: CrashableNode, sandbox_id: str) -> Path:
    return node.home / "runtime" / sandbox_id / "pause-state"


def test_kill9_with_a_freeze_or_thaw_in_doubt() -> None:
    """Freeze and thaw go over runsc's control socket, and runsc's own state file does not
    see them: the driver's pause marker is the truth. A crash inside one of them leaves
    ``freezing``/``thawing``, where nobody can tell whether the call took effect (and a resume
    of a sandbox that runs kills it). Recovery writes such sandboxes to disk instead: right in
    either case. The three windows are made by hand, then the server is killed."""
    with crashable(pause_hot_s="600") as node:
        not_sent = _with_mark("freeze-not-sent")  # cut before the Pause call went out
        took_effect = _with_mark("freeze-took-effect")  # cut after it, before "frozen"
        thawing = _with_mark("thaw-in-doubt")  # a hot-paused one, cut before its Resume
        marks = {s.sandbox_id: m for s, m in ((not_sent, "freeze-not-sent"),
                                              (took_effect, "freeze-took-effect"),
                                              (thawing, "thaw-in-doubt"))}
        assert thawing.pause() is True
        assert _pause_marker(node, thawing.sandbox_id).read_text() == "frozen"
        _pause_marker(node, not_sent.sandbox_id).write_text("freezing")
        _pause_marker(node, took_effect.sandbox_id).write_text("freezing")
        socket_path = node.home / "runtime" / "runsc" / f"runsc-{took_effect.sandbox_id}.sock"
        asyncio.run(urpc.call(socket_path, "containerManager.Pause"))
        _pause_marker(node, thawing.sandbox_id).write_text("thawing")
        node.kill9()

        node.restart()
        log = node.log_since_restart()
        for sandbox in (not_sent, took_effect, thawing):
            assert f"sandbox {sandbox.sandbox_id} was cut short" in log, log[-3000:]
        listed = live_sandboxes()
        assert all(listed[s] == SandboxState.PAUSED for s in marks), listed
        check_recovered(node, {s.sandbox_id: s for s in (not_sent, took_effect, thawing)},
                        marks, paused={thawing.sandbox_id})
