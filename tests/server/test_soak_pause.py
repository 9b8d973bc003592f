"""Soak: 120 pause/resume cycles of one sandbox, every fourth one through disk and the repository.

Three cycles in four resume at once (a thaw of the frozen sandbox); the fourth waits until the
pause has been spilled (``pause_hot_s=0.5``) and published to the repository, and the resume
restores from that image. Each cycle the sandbox's files are checksummed
(no drift), one file changes (so every image differs), and at the end a GC pass brings the
repository back to what the committed manifests need: its size is bounded, not growing with the
number of cycles, and no manifest's layer chain grew (three GC passes, 40 cycles apart: 200
cycles took 219 s of the suite's 30 minutes on CI; ``bench.torture`` soaks for longer).

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(1200)]

CYCLES = 120
GC_EVERY = 40
DISK_EVERY = 4
CHECK = "cd /home/user/data && md5sum * | md5sum"


def _published(home: Path, sandbox_id: str) -> bool:
    db = sqlite3.connect(home / "state.db")
    try:
        row = db.execute("SELECT state, instance FROM sandboxes WHERE sandbox_id = ?",
                         (sandbox_id,)).fetchone()
    finally:
        db.close()
    return bool(row and row[0] == "paused" and row[1] and json.loads(row[1]).get("published"))


def _blob_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "repository" / "blobs").rglob("*")
               if p.is_file())


def _layers_of(home: Path, snapshot_id: str) -> int:
    path = home / "repository" / "manifests" / f"{snapshot_id}.json"
    return len(json.loads(path.read_text())["layers"])


def test_120_pause_resume_cycles_keep_files_and_bound_the_repository() -> None:
    with serving(pause_hot_s="0.5", gc_grace_s="0", gc_interval_s="0") as node:
        sbx = Sandbox.create(timeout=3600)
        sandbox_id = sbx.sandbox_id
        sbx.commands.run("mkdir -p /home/user/data && cd /home/user/data && "
                         "head -c 4000000 /dev/urandom > big && seq 1 100000 > seq && "
                         "echo 0 > cycle")
        expected = sbx.commands.run(CHECK).stdout
        layers: set[int] = set()
        sizes: list[int] = []
        for cycle in range(1, CYCLES + 1):
            sbx.pause()
            if cycle % DISK_EVERY == 0:
                _wait(node, lambda: _published(node.home, sandbox_id), f"publish {cycle}")
                layers.add(_layers_of(node.home, f"paused-{sandbox_id}"))
            sbx = Sandbox.connect(sandbox_id, timeout=3600)
            assert sbx.commands.run(CHECK).stdout == expected, f"files drifted at {cycle}"
            sbx.commands.run(f"echo {cycle} > /home/user/data/cycle")
            expected = sbx.commands.run(CHECK).stdout
            if cycle % GC_EVERY == 0:
                _gc(node)
                sizes.append(_blob_bytes(node.home))
        assert len(layers) == 1, f"the layer chain changed: {layers}"
        restored = node.log().count(f"resumed {sandbox_id} (restored)")
        assert restored >= CYCLES // DISK_EVERY, restored
        # After each GC the repository holds the base image, the layers and the envd bundle:
        # the same few hundred MB at cycle 40 as at cycle 120 (one image of ~35 MB of slack).
        assert max(sizes) - min(sizes) < 64 << 20, sizes


def _gc(node: NodeServer) -> None:
    response = httpx.post(f"{node.url}/repository/gc", headers={"X-API-KEY": API_KEY},
                          timeout=120)
    assert response.status_code == 200, response.text


def _wait(node: NodeServer, check: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out: {what}\n{node.log()[-3000:]}"
        time.sleep(0.02)
