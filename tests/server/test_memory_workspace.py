"""The other workspace mode (``workspace = "memory"``): written files in sandbox memory.

The suite runs on disk workspaces (the default); this module keeps the memory mode's own paths
tried end to end on one node: a create restores the base template's memory image, files and a
running process survive pause/resume, a snapshot and a fork carry the files (they are part of
the memory image), a built template with a start command restores with it running, and no disk
image is made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox, Template

from tests.counter import COUNT
from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(600)]

@pytest.fixture(scope="module")
def memory_node() -> Iterator[NodeServer]:
    with serving(workspace="memory", warm_pool_size="0", pause_hot_s="0") as node:
        yield node


def _count(sbx: Sandbox) -> int:
    return int(sbx.files.read("/tmp/count").strip())


def test_files_and_processes_live_in_the_memory_image(memory_node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        assert not (memory_node.home / "workspaces").exists()  # no pool, no disk image
        sbx.files.write("/home/user/kept.txt", "kept")
        sbx.commands.run(COUNT)
        time.sleep(0.5)
        before = _count(sbx)
        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert sbx.files.read("/home/user/kept.txt") == "kept"
        first = _count(sbx)
        time.sleep(0.5)
        assert _count(sbx) > first >= before  # the same process, counting on

        snapshot = sbx.create_snapshot()
        child = Sandbox.create(snapshot.snapshot_id, timeout=300)
        assert child.files.read("/home/user/kept.txt") == "kept"
        child.kill()
        forked = httpx.post(f"{memory_node.url}/sandboxes/{sbx.sandbox_id}/fork",
                            json={"count": 2}, headers={"X-API-KEY": API_KEY}, timeout=120)
        assert forked.status_code == 201, forked.text
        for entry in forked.json():
            kid = Sandbox.connect(entry["sandbox"]["sandboxID"], timeout=120)
            assert kid.files.read("/home/user/kept.txt") == "kept"
            kid.kill()
    finally:
        sbx.kill()


def test_a_built_template_restores_with_its_start_command_running(
    memory_node: NodeServer,
) -> None:
    name = f"mem-start-{time.time_ns()}"
    Template.build(
        Template().from_template("base").run_cmd("echo built > ~/built.txt")
        .set_start_cmd("while true; do date +%s%N > ~/a.new; mv ~/a.new ~/alive; sleep 0.3; "
                       "done", "test -s ~/alive"),
        name)
    sbx = Sandbox.create(name, timeout=300)
    try:
        assert sbx.files.read("/home/user/built.txt") == "built\n"
        before = sbx.files.read("/home/user/alive")
        time.sleep(1.0)
        assert sbx.files.read("/home/user/alive") != before
    finally:
        sbx.kill()
