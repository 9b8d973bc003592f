"""``memory_merge`` (KSM for the sandboxes' processes): on, every runsc process of the node is
opted in and the host's ksmd runs; the lifecycle gives the same results on and off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.server.harness import leaked_sandboxes, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]

KSM_RUN = Path("/sys/kernel/mm/ksm/run")


@pytest.fixture
def ksm_restored() -> Iterator[None]:
    """The host's KSM as it was before the test (a node turns it on and leaves it so)."""
    if not KSM_RUN.exists():
        pytest.skip("this kernel has no KSM")
    before = KSM_RUN.read_text().strip()
    try:
        yield
    finally:
        if before != "1":
            KSM_RUN.write_text("2\n")  # unmerge what the test merged, then as it was
            KSM_RUN.write_text(f"{before}\n")


def _merge_any(home: Path) -> set[str]:
    """``ksm_merge_any`` of every runsc process of the node at ``home``."""
    found = set()
    for pid in leaked_sandboxes(home):
        try:
            stat = Path(f"/proc/{pid}/ksm_stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        for line in stat.splitlines():  # "ksm_merge_any: yes"
            key, _, value = line.partition(":")
            if key.strip() == "ksm_merge_any":
                found.add(value.strip())
    return found


def _lifecycle() -> list[str]:
    """Create, write, run, pause, resume, fork, snapshot: what each step shows."""
    seen = []
    sbx = Sandbox.create(timeout=300)
    sbx.files.write("/home/user/kept.txt", "kept across everything")
    seen.append(sbx.commands.run("echo $((6*7)); cat /home/user/kept.txt").stdout)
    sbx.commands.run("sleep 600", background=True)
    sbx.pause()
    sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
    seen.append(sbx.files.read("/home/user/kept.txt"))
    seen.append(str(len([p for p in sbx.commands.list() if "sleep" in p.cmd])))
    children = sbx.fork(count=2, timeout=120)
    assert all(isinstance(c, Sandbox) for c in children), children
    for child in children:
        seen.append(child.commands.run("cat /home/user/kept.txt; echo child").stdout)
        child.kill()
    snapshot = sbx.create_snapshot()
    made = Sandbox.create(snapshot.snapshot_id, timeout=120)
    seen.append(made.files.read("/home/user/kept.txt"))
    made.kill()
    sbx.kill()
    Sandbox.delete_snapshot(snapshot.snapshot_id)
    return seen


def test_the_lifecycle_is_the_same_with_memory_merge_on_and_off(ksm_restored: None) -> None:
    with serving() as off:
        results_off = _lifecycle()
        Sandbox.create(timeout=60)
        assert _merge_any(off.home) == {"no"}
    with serving(memory_merge="true") as on:
        assert KSM_RUN.read_text().strip() == "1"
        results_on = _lifecycle()
        Sandbox.create(timeout=60)
        assert _merge_any(on.home) == {"yes"}
    assert results_on == results_off
    assert results_on[0] == "42\nkept across everything"
