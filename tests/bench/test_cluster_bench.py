"""``python -m bench.cluster --quick`` end to end: issue 13's layout (three nodes in network
namespaces of their own, two schedulers, two gateways), then one node, real sandboxes.
Checks the shape of the results and the one ordering that cannot fail on a sound gateway
(a call through it takes longer than the same call straight to the node); no absolute
thresholds, the machine is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.harness import REPO, slot_base

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(900)]


def test_quick_run_reports_latency_placement_and_creates_per_second(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))}
    # Slots and addresses of the upper half of this session's block: its own nodes are below.
    env["AENV_TEST_SLOT_BASE"] = str(slot_base() + 5_000)
    done = subprocess.run([sys.executable, "-m", "bench.cluster", "--quick", "--out", str(out)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=800,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    rows = report["latency"]["rows"]
    assert {row["n"] for row in rows.values()} == {30}
    assert rows["info via gateway"]["p50"] > rows["info direct"]["p50"] > 0
    assert report["latency"]["ratio"]["info"] > 1
    assert report["placement"]["rows"]["placement"]["p50"] > 0
    assert [row["nodes"] for row in report["throughput"]] == [3, 1]
    assert all(row["creates"] == 6 and row["creates_per_s"] > 0 for row in report["throughput"])
    assert report["creates_per_s_3_over_1"] > 0
    assert "| info via gateway |" in done.stdout
