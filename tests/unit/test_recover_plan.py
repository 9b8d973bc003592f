"""Crash recovery's pure half: ``decide()`` (one record) and ``plan()`` (the whole node).

One table row per case of the rule list in ``aenv.orchestrator.recover``'s docstring, plus the
orphans (runtime sandboxes no record knows). No runtime, no disk, no root.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import pytest

from aenv.core.states import SandboxState
from aenv.orchestrator.recover import Action, Plan, decide, plan, unreadable
from aenv.runtime.base import Observed
from aenv.store.models import UNREADABLE, SandboxRecord, from_row, to_row

S = SandboxState
A = Action

SLOT = {"index": 46001, "netns": "aenv-46001", "netns_path": "/run/netns/aenv-46001",
        "host_ifname": "aenv-46001-h", "guest_ifname": "aenv-46001-g"}


def _instance(kind: str, sandbox_id: str) -> dict[str, Any] | None:
    """The record's ``instance`` JSON as each lifecycle stage leaves it."""
    live = {"slot": SLOT, "runtime_id": sandbox_id, "pid": 4242,
            "envd_bundle": "/home/envd/abc"}
    if kind == "live":        # running, or mid snapshot / fork / pause-freeze
        return live
    if kind == "frozen":      # paused in memory (or being spilled / thawed)
        return {**live, "frozen": True}
    if kind == "disk":        # paused to disk: only the image (and the bundle) remain
        return {"envd_bundle": "/home/envd/abc", "image": f"/home/paused/{sandbox_id}"}
    if kind == "restoring":   # resume from disk: slot taken, no runtime id recorded yet
        return {"envd_bundle": "/home/envd/abc", "image": f"/home/paused/{sandbox_id}",
                "slot": SLOT}
    if kind == "none":        # creating, before boot wrote anything
        return None
    raise AssertionError(kind)


def _record(state: SandboxState, kind: str = "live", sandbox_id: str = "sbx1") -> SandboxRecord:
    now = time.time()
    return SandboxRecord(
        sandbox_id=sandbox_id, template_id="base", state=state, version=3, created_at=now,
        started_at=now, end_at=now + 300, cpu_count=2, memory_mb=512, disk_size_mb=1024,
        envd_token="tok", client_id="c", instance=_instance(kind, sandbox_id),
    )


def _observed(status: str | None, sandbox_id: str = "sbx1") -> Observed | None:
    if status is None:
        return None
    pid = None if status == "stopped" else 4242
    return Observed(runtime_id=sandbox_id, sandbox_id=sandbox_id, status=status, pid=pid)


@dataclass(frozen=True)
class Row:
    state: SandboxState
    kind: str            # see _instance
    status: str | None   # runsc's view; None: runsc does not know the sandbox at all
    image: bool          # a complete memory image is on disk
    expect: Action
    why: str
    #: A known product bug makes ``decide`` answer otherwise (the row is a strict xfail).
    bug: str | None = None

    @property
    def id(self) -> str:
        return (f"{self.state}-{self.kind}-{self.status or 'absent'}"
                f"{'-image' if self.image else ''}->{self.expect.value}")


ROWS = [
    # -- running / snapshotting / forking: alive -> running (thawed if frozen), else gone ------
    Row(S.RUNNING, "live", "running", False, A.RUNNING, "the common case after kill -9"),
    Row(S.RUNNING, "live", "created", False, A.RUNNING, "created counts as alive"),
    Row(S.RUNNING, "live", "paused", False, A.RUNNING, "frozen by a cut-short op: thawed"),
    Row(S.RUNNING, "live", "stopped", False, A.TEARDOWN, "the sandbox died with the host"),
    Row(S.RUNNING, "live", "unknown", False, A.TEARDOWN, "runsc cannot say: not alive"),
    Row(S.RUNNING, "live", None, False, A.TEARDOWN, "runsc has no such container"),
    Row(S.RUNNING, "live", None, True, A.TEARDOWN, "a stray image does not revive it"),
    Row(S.SNAPSHOTTING, "live", "running", False, A.RUNNING, "checkpoint never started"),
    Row(S.SNAPSHOTTING, "live", "paused", False, A.RUNNING, "cut mid --leave-running save"),
    Row(S.SNAPSHOTTING, "live", "stopped", False, A.TEARDOWN, "source died"),
    Row(S.SNAPSHOTTING, "live", None, False, A.TEARDOWN, "source gone"),
    Row(S.FORKING, "live", "running", False, A.RUNNING, "source runs on"),
    Row(S.FORKING, "live", "paused", False, A.RUNNING, "cut mid --leave-running save"),
    Row(S.FORKING, "live", "stopped", False, A.TEARDOWN, "source died"),
    Row(S.FORKING, "live", None, False, A.TEARDOWN, "source gone"),
    # -- paused and frozen: alive -> stays frozen (spill re-scheduled), dead -> gone ----------
    Row(S.PAUSED, "frozen", "paused", False, A.FROZEN, "an acknowledged hot pause"),
    Row(S.PAUSED, "frozen", "running", False, A.FROZEN, "the record wins: refrozen"),
    Row(S.PAUSED, "frozen", "created", False, A.FROZEN, "alive is alive"),
    Row(S.PAUSED, "frozen", "stopped", False, A.TEARDOWN, "frozen memory lost"),
    Row(S.PAUSED, "frozen", None, False, A.TEARDOWN, "frozen memory lost"),
    # -- paused on disk: the image is the sandbox -----------------------------------------------
    Row(S.PAUSED, "disk", None, True, A.ON_DISK, "nothing runs; the image is kept"),
    Row(S.PAUSED, "disk", "paused", True, A.ON_DISK, "crash before the spill freed it"),
    Row(S.PAUSED, "disk", "stopped", True, A.ON_DISK, "exited after its checkpoint"),
    Row(S.PAUSED, "disk", None, False, A.TEARDOWN, "image lost: nothing survives"),
    Row(S.PAUSED, "disk", "paused", False, A.TEARDOWN, "no image, not a frozen record"),
    # -- pausing (the freeze or the spill was cut short) ---------------------------------------
    Row(S.PAUSING, "frozen", "paused", False, A.FROZEN, "spill cut short: still frozen"),
    Row(S.PAUSING, "frozen", "paused", True, A.ON_DISK,
        "the spill's save finished (recovery waits for it): the image is the sandbox; the "
        "sentry lingers paused after a save without --leave-running but is unusable"),
    Row(S.PAUSING, "live", "paused", True, A.ON_DISK,
        "as above, the record not yet flagged"),
    Row(S.PAUSING, "frozen", "running", False, A.FROZEN, "flagged by the record"),
    Row(S.PAUSING, "live", "paused", False, A.FROZEN, "freeze done, record not yet"),
    Row(S.PAUSING, "live", "running", False, A.RUNNING, "the pause never answered"),
    Row(S.PAUSING, "live", "created", False, A.RUNNING, "the pause never answered"),
    Row(S.PAUSING, "frozen", "stopped", True, A.ON_DISK, "spill finished, sandbox exited"),
    Row(S.PAUSING, "frozen", None, True, A.ON_DISK, "spill finished, runtime gone"),
    Row(S.PAUSING, "live", "stopped", True, A.ON_DISK, "exited with a complete image"),
    Row(S.PAUSING, "frozen", "stopped", False, A.TEARDOWN, "died with half an image"),
    Row(S.PAUSING, "live", None, False, A.TEARDOWN, "nothing survives"),
    Row(S.PAUSING, "frozen", "unknown", False, A.TEARDOWN, "not alive, no image"),
    # -- resuming by thaw -------------------------------------------------------------------------
    Row(S.RESUMING, "frozen", "running", False, A.RUNNING, "thawed; record not yet"),
    Row(S.RESUMING, "frozen", "paused", False, A.RUNNING, "thaw not yet done: thawed now"),
    Row(S.RESUMING, "frozen", "stopped", False, A.TEARDOWN, "frozen memory lost"),
    Row(S.RESUMING, "frozen", None, False, A.TEARDOWN, "frozen memory lost"),
    # -- resuming from disk ---------------------------------------------------------------------
    Row(S.RESUMING, "restoring", "running", True, A.BACK_TO_DISK, "restore cut short"),
    Row(S.RESUMING, "restoring", "created", True, A.BACK_TO_DISK, "restore cut short"),
    Row(S.RESUMING, "restoring", None, True, A.BACK_TO_DISK, "restore never started"),
    Row(S.RESUMING, "disk", None, True, A.BACK_TO_DISK, "slot not even taken"),
    Row(S.RESUMING, "restoring", "stopped", True, A.BACK_TO_DISK, "restore died"),
    Row(S.RESUMING, "restoring", "running", False, A.RUNNING, "image gone, runtime alive"),
    Row(S.RESUMING, "restoring", None, False, A.TEARDOWN, "neither runtime nor image"),
    Row(S.RESUMING, "restoring", "stopped", False, A.TEARDOWN, "neither runtime nor image"),
    # -- creating / killing: always torn down ---------------------------------------------------
    Row(S.CREATING, "none", None, False, A.TEARDOWN, "create never acknowledged"),
    Row(S.CREATING, "live", "running", False, A.TEARDOWN, "booted, never acknowledged"),
    Row(S.CREATING, "live", "paused", False, A.TEARDOWN, "fork child mid-restore"),
    Row(S.CREATING, "live", "stopped", True, A.TEARDOWN, "an image does not save it"),
    Row(S.KILLING, "live", "running", False, A.TEARDOWN, "finish the kill"),
    Row(S.KILLING, "frozen", "paused", False, A.TEARDOWN, "finish the kill"),
    Row(S.KILLING, "disk", None, True, A.TEARDOWN, "finish the kill, image and all"),
    Row(S.KILLING, "live", None, False, A.TEARDOWN, "finish the kill"),
    # -- a freeze or thaw over the control socket cut short: paused or not, nobody knows ------
    Row(S.PAUSING, "live", "in-doubt", False, A.SPILL, "cut between 'freezing' and the call"),
    Row(S.PAUSING, "live", "in-doubt", True, A.ON_DISK, "the spill's save finished first"),
    Row(S.PAUSED, "frozen", "in-doubt", False, A.SPILL, "never thaw what may be running"),
    Row(S.RESUMING, "frozen", "in-doubt", False, A.SPILL, "cut between 'thawing' and the call"),
    Row(S.RUNNING, "live", "in-doubt", False, A.SPILL, "a freeze whose call got no answer"),
    Row(S.SNAPSHOTTING, "live", "in-doubt", False, A.SPILL, "same, then a snapshot began"),
    Row(S.CREATING, "live", "in-doubt", False, A.TEARDOWN, "never acknowledged"),
    Row(S.KILLING, "frozen", "in-doubt", False, A.TEARDOWN, "finish the kill"),
]


def _params(rows: list[Row]) -> list[object]:
    return [pytest.param(r, id=r.id, marks=[pytest.mark.xfail(strict=True, reason=r.bug)]
                         if r.bug else []) for r in rows]


@pytest.mark.parametrize("row", _params(ROWS))
def test_decide(row: Row) -> None:
    record = _record(row.state, row.kind)
    assert decide(record, _observed(row.status), row.image) == row.expect, row.why


def test_every_state_has_rows() -> None:
    """A new lifecycle state must get rows here (and a rule in recover.py)."""
    assert {r.state for r in ROWS} == set(SandboxState)


@pytest.mark.parametrize("state", list(SandboxState))
def test_nothing_left_means_teardown(state: SandboxState) -> None:
    """The overall rule: with neither a live runtime nor a complete image, a sandbox goes."""
    for kind in ("live", "frozen", "disk", "none"):
        for status in (None, "stopped", "unknown"):
            record = _record(state, kind)
            assert decide(record, _observed(status), False) == A.TEARDOWN, (kind, status)


@pytest.mark.parametrize("state", [S.RUNNING, S.SNAPSHOTTING, S.FORKING, S.PAUSED, S.PAUSING,
                                   S.RESUMING])
def test_something_survives_means_kept(state: SandboxState) -> None:
    """...and with a live runtime (which a record may claim) or a complete image, it stays,
    unless the record's own kind rules it out (on-disk records ignore a runtime)."""
    kind = {S.PAUSED: "frozen", S.PAUSING: "frozen", S.RESUMING: "frozen"}.get(state, "live")
    assert decide(_record(state, kind), _observed("running"), False) != A.TEARDOWN
    assert decide(_record(state, kind), _observed("paused"), False) != A.TEARDOWN
    assert decide(_record(state, kind), _observed("in-doubt"), False) == A.SPILL


@pytest.mark.parametrize("state", list(SandboxState))
def test_decide_is_pure(state: SandboxState) -> None:
    record = _record(state, "frozen")
    observed = _observed("paused")
    before = copy.deepcopy((record, observed))
    first = decide(record, observed, True)
    assert decide(record, observed, True) == first
    assert (record, observed) == before


# -- plan() ---------------------------------------------------------------------------------


def test_plan_applies_decide_to_each_record_by_sandbox_id() -> None:
    rows = [r for r in ROWS if r.bug is None]
    records, observed, images = [], [], set()
    for i, row in enumerate(rows):
        sid = f"sbx{i:03d}"
        records.append(_record(row.state, row.kind, sid))
        seen = _observed(row.status, sid)
        if seen is not None:
            observed.append(seen)
        if row.image:
            images.add(sid)
    result = plan(records, observed, images)
    assert result.actions == {f"sbx{i:03d}": row.expect for i, row in enumerate(rows)}
    assert result.orphans == []


def test_plan_orphans_are_runtime_sandboxes_no_record_knows() -> None:
    records = [_record(S.RUNNING, "live", "known1"), _record(S.CREATING, "none", "known2")]
    warm = Observed(runtime_id="warm1", sandbox_id="warm1", status="running", pid=1)
    unacked = Observed(runtime_id="lost1", sandbox_id="lost1", status="created", pid=2)
    dead = Observed(runtime_id="dead1", sandbox_id="dead1", status="stopped", pid=None)
    frozen = Observed(runtime_id="froz1", sandbox_id="froz1", status="paused", pid=3)
    known = Observed(runtime_id="known1", sandbox_id="known1", status="running", pid=4)
    result = plan(records, [warm, known, unacked, dead, frozen], set())
    # Every unknown one, whatever its status (a dead one still has runsc state to remove);
    # in the order observed.
    assert result.orphans == [warm, unacked, dead, frozen]
    assert result.actions == {"known1": A.RUNNING, "known2": A.TEARDOWN}


def test_plan_matches_runtime_by_sandbox_id_not_runtime_id() -> None:
    record = _record(S.RUNNING, "live", "sbxA")
    seen = Observed(runtime_id="other-container-id", sandbox_id="sbxA", status="running", pid=9)
    result = plan([record], [seen], set())
    assert result.actions == {"sbxA": A.RUNNING}
    assert result.orphans == []


def test_plan_images_of_unknown_sandboxes_do_not_make_records() -> None:
    record = _record(S.PAUSED, "disk", "sbxA")
    result = plan([record], [], {"sbxA", "stray"})
    assert result.actions == {"sbxA": A.ON_DISK}
    assert result.orphans == []


def test_plan_of_nothing() -> None:
    result = plan([], [], set())
    assert result.actions == {} and result.orphans == []
    assert result.reattach == [] and result.teardown == []


def test_plan_groups() -> None:
    records = [
        _record(S.RUNNING, "live", "run"),
        _record(S.PAUSED, "frozen", "frz"),
        _record(S.PAUSED, "disk", "dsk"),
        _record(S.RESUMING, "restoring", "back"),
        _record(S.CREATING, "none", "gone"),
        _record(S.KILLING, "live", "gone2"),
    ]
    observed = [_observed("running", "run"), _observed("paused", "frz"),
                _observed("running", "back"), _observed("running", "gone2")]
    result = plan(records, [o for o in observed if o is not None], {"dsk", "back"})
    assert isinstance(result, Plan)
    assert result.of(A.RUNNING) == ["run"]
    assert result.of(A.FROZEN) == ["frz"]
    assert result.of(A.ON_DISK) == ["dsk"]
    assert result.of(A.BACK_TO_DISK) == ["back"]
    assert result.reattach == ["run", "frz"]
    assert sorted(result.teardown) == ["gone", "gone2"]
    assert result.orphans == []


def test_plan_is_pure() -> None:
    records = [_record(S.PAUSING, "frozen", "a"), _record(S.RUNNING, "live", "b")]
    observed = [o for o in (_observed("paused", "a"), _observed("running", "c")) if o]
    images = {"a"}
    before = copy.deepcopy((records, observed, images))
    first = plan(records, observed, images)
    second = plan(records, observed, images)
    assert first.actions == second.actions and first.orphans == second.orphans
    assert (records, observed, images) == before


# -- records recovery cannot read: torn down, never a reason to stop the node ----------------

#: An instance JSON that parses but is not what any stage writes (a hand edit, another version).
BAD_INSTANCES = [
    pytest.param([1, 2], id="a-list"),
    pytest.param("sbx1", id="a-string"),
    pytest.param({"slot": {"index": 1}}, id="slot-missing-fields"),
    pytest.param({"slot": "aenv-1", "runtime_id": "sbx1"}, id="slot-not-an-object"),
]


@pytest.mark.parametrize("instance", BAD_INSTANCES)
@pytest.mark.parametrize("status", ["running", "paused", None])
def test_unreadable_instance_means_teardown(instance: Any, status: str | None) -> None:
    for state in (S.RUNNING, S.PAUSED, S.PAUSING, S.RESUMING):
        record = _record(state).evolve(instance=instance)
        reason = unreadable(record)
        assert reason is not None and reason.startswith(UNREADABLE)
        assert decide(record, _observed(status), True) == A.TEARDOWN, state


def test_row_with_corrupt_json_is_read_with_the_reason() -> None:
    """A torn or hand-edited row: readable (a listing, the recovery go on), column empty, the
    reason in ``last_error``; recovery then tears the sandbox down."""
    row = to_row(_record(S.RUNNING))
    row["instance"] = '{"slot": {"index": 4'
    row["metadata"] = "not json"
    record = from_row(row)
    assert record.instance is None and record.metadata == {}
    assert record.last_error is not None and record.last_error.startswith(UNREADABLE)
    assert "instance" in record.last_error and "metadata" in record.last_error
    assert unreadable(record) == record.last_error
    assert decide(record, _observed("running"), False) == A.TEARDOWN
    # A readable row is untouched: no reason, the same record back.
    good = _record(S.RUNNING)
    assert from_row(to_row(good)) == good and unreadable(good) is None


def test_unreadable_records_are_planned_with_the_rest() -> None:
    """One bad record changes nothing for the others."""
    good = _record(S.RUNNING, "live", "good1")
    bad = _record(S.RUNNING, "live", "bad1").evolve(instance=["x"])
    observed = [o for o in (_observed("running", "good1"), _observed("running", "bad1")) if o]
    result = plan([good, bad], observed, set())
    assert result.actions == {"good1": A.RUNNING, "bad1": A.TEARDOWN}
    assert result.orphans == []
