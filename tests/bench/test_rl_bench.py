"""``aenv bench rl --quick`` end to end: the real command, its own real nodes (one per mode),
real gVisor sandboxes. Checks the shape of the results and the one ordering the benchmark
exists to show (fork uses fewer environment-seconds than cold); no absolute thresholds, the
machine is shared.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli_run import AENV
from tests.server.harness import slot_base

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(1200)]

MODES = ("cold", "template", "fork")


def test_quick_run_reports_three_modes_and_fork_is_cheaper(tmp_path: Path) -> None:
    out, plot = tmp_path / "rl.json", tmp_path / "rl.svg"
    # No E2B_*: the benchmark starts a node of its own per mode (not a session node's URL).
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    # Its nodes take slots from the upper half of this session's block (the lower half is
    # where this session's own nodes are, one of them maybe still running).
    env["AENV_TEST_SLOT_BASE"] = str(slot_base() + 5_000)
    done = subprocess.run(
        [str(AENV), "bench", "rl", "--quick", "--files", "300", "--deps", "requests",
         "--out", str(out), "--svg", str(plot)],
        env=env, capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert list(report["modes"]) == list(MODES)
    # The setup pip-installed requests (and its dependencies) from real wheels.
    assert report["meta"]["dependencies"] == ["requests"]
    for name in MODES:
        mode = report["modes"][name]
        assert mode["episodes"] == 4, name
        # Half the scripted rollouts fix the bug: the rewards are real test runs.
        assert mode["mean_reward"] == 0.5, name
        assert mode["env_s"] > 0 and mode["gb_h"] > 0 and mode["samples"] > 0, name
    cold, fork = report["modes"]["cold"], report["modes"]["fork"]
    assert fork["env_s"] < cold["env_s"]
    assert set(report["reductions"]) == {"template", "fork"}
    assert fork["by_role"]["parent"]["sandboxes"] == 1
    assert fork["by_role"]["rollout"]["sandboxes"] == 4
    assert "| fork |" in done.stdout
    assert plot.read_text().startswith("<svg")
