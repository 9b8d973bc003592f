"""Harbor's own runner (``harbor run``) on a real node through ``aenv.integrations.harbor``.

Two tiny tasks (``harbor_tasks/``: a Dockerfile on the node's base template with a setup RUN
step, a solution, a verifier writing the reward), 4 rollouts each, with Harbor's ``oracle`` agent:
every trial gets reward 1.0; the node built each template once, started one prepared parent
per template and forked the 8 trial sandboxes from them; nothing runs afterwards. Then a
``nop`` run (reward 0) from a second Harbor process reuses both templates, and a Harbor
killed with SIGKILL mid-trial leaves sandboxes that ``aenv kill --metadata run=...`` ends.

Harbor needs Python >= 3.12, so it runs from its own venv (``scripts/harbor-venv.sh``, made
once per machine), as a subprocess, pointed at the node by ``E2B_API_URL``/``E2B_API_KEY``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.harness import API_KEY, NodeServer, client_env, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).with_name("harbor_tasks")
#: One task whose solution sleeps: the crash test kills Harbor while it runs.
SLOW_TASK = Path(__file__).with_name("harbor_slow_task")
ENV = "aenv.integrations.harbor:AenvEnvironment"
PLUGIN = "aenv.integrations.harbor:AenvJobPlugin"
#: One harbor run: two template builds (a RUN step each, in gVisor) on a loaded 2-core host.
RUN_TIMEOUT_S = 600
#: Making the venv: ~50 s of pip from the local index.
VENV_TIMEOUT_S = 600

_BUILT = re.compile(r"build \S+ of (harbor-[0-9a-f]+) ready")
_CREATED = re.compile(r"created (\S+) \(")
_FORKED = re.compile(r"forked (\S+) into (\d+)/(\d+)")


@pytest.fixture(scope="module")
def harbor_venv() -> Path:
    started = time.monotonic()
    done = subprocess.run([str(REPO / "scripts" / "harbor-venv.sh")], capture_output=True,
                          text=True, timeout=VENV_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"scripts/harbor-venv.sh failed:\n{done.stderr[-3000:]}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    print(f"harbor venv {venv} ready in {time.monotonic() - started:.1f} s")
    return venv


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving() as server:
        yield server


def harbor_run(venv: Path, node: NodeServer, jobs: Path, name: str, agent: str,
               attempts: int) -> dict[str, Any]:
    """``harbor run`` on the dataset; its job result.json."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))},
           **client_env(node), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [str(venv / "bin" / "harbor"), "run", "-p", str(TASKS), "-a", agent, "-e", ENV,
            "--plugin", PLUGIN, "-k", str(attempts), "-n", "4", "-y", "-q",
            "-o", str(jobs), "--job-name", name]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          check=False, cwd=jobs)
    print(f"harbor run {name}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    result = jobs / name / "result.json"
    assert done.returncode == 0 and result.is_file(), (
        f"harbor run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        f"\n{_trial_errors(jobs / name)}")
    return dict(json.loads(result.read_text()))


def trial_rewards(job: Path) -> list[float | None]:
    rewards: list[float | None] = []
    for result in sorted(job.glob("*/result.json")):
        trial = json.loads(result.read_text())
        verifier = trial.get("verifier_result") or {}
        rewards.append((verifier.get("rewards") or {}).get("reward"))
    return rewards


def _trial_errors(job: Path) -> str:
    return "\n".join(f"{p.parent.name}: {p.read_text()[-1500:]}"
                     for p in sorted(job.glob("*/exception.txt")))


def running(node: NodeServer) -> list[dict[str, Any]]:
    response = httpx.get(f"{node.url}/v2/sandboxes", headers={"X-API-KEY": API_KEY},
                         params={"state": "running,paused"}, timeout=10)
    response.raise_for_status()
    return list(response.json())


def test_oracle_2_tasks_x_4_rollouts_fork_from_prepared_parents(
        harbor_venv: Path, node: NodeServer, tmp_path: Path) -> None:
    job = harbor_run(harbor_venv, node, tmp_path, "oracle", "oracle", attempts=4)

    assert job["stats"]["n_errored_trials"] == 0, _trial_errors(tmp_path / "oracle")
    assert trial_rewards(tmp_path / "oracle") == [1.0] * 8
    log = node.log()
    # Each task's template was built once.
    built = Counter(_BUILT.findall(log))
    assert len(built) == 2 and set(built.values()) == {1}, built
    # One prepared parent per template; the 8 trials are fork children of the two.
    forked: Counter[str] = Counter()
    for parent, ok, wanted in _FORKED.findall(log):
        assert ok == wanted, f"a fork of {parent} lost children"
        forked[parent] += int(ok)
    assert len(forked) == 2 and sum(forked.values()) == 8, forked
    # The node logs a fork child as created too: 2 parents + 8 children, the parents created
    # before their forks (and not made by a fork themselves).
    created = _CREATED.findall(log)
    assert len(created) == 2 + 8 and set(forked) <= set(created), (created, forked)
    # The trials' stops killed the children, the job-end plugin the parents.
    assert running(node) == []


def test_nop_agent_gets_reward_0_and_reuses_the_templates(
        harbor_venv: Path, node: NodeServer, tmp_path: Path) -> None:
    builds_before = len(_BUILT.findall(node.log()))
    job = harbor_run(harbor_venv, node, tmp_path, "nop", "nop", attempts=1)

    assert job["stats"]["n_errored_trials"] == 0, _trial_errors(tmp_path / "nop")
    assert trial_rewards(tmp_path / "nop") == [0.0, 0.0]
    assert len(_BUILT.findall(node.log())) == builds_before, "the templates were rebuilt"
    assert running(node) == []


def test_a_sigkilled_harbor_leaves_its_run_to_aenv_kill_by_label(
        harbor_venv: Path, node: NodeServer, tmp_path: Path) -> None:
    """Harbor killed mid-trial runs no cleanup at all: the parent and children stay, each
    labelled ``run=harbor-<job name>``, and ``aenv kill --metadata run=…`` ends them."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "AENV_"))},
           **client_env(node), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [str(harbor_venv / "bin" / "harbor"), "run", "-p", str(SLOW_TASK), "-a", "oracle",
            "-e", ENV, "-k", "2", "-n", "2", "-y", "-q", "-o", str(tmp_path),
            "--job-name", "crash"]
    harbor = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while len(labelled := [s for s in running(node)
                               if s.get("metadata", {}).get("run") == "harbor-crash"]) < 3:
            assert harbor.poll() is None, "harbor ended before its trials ran"
            assert time.monotonic() < deadline, "no parent and 2 children in time"
            time.sleep(0.5)
    finally:
        os.killpg(harbor.pid, signal.SIGKILL)
        harbor.wait()
    time.sleep(2)  # nothing of Harbor's is left to clean up; the sandboxes run on
    assert {s["sandboxID"] for s in running(node)} == {s["sandboxID"] for s in labelled}

    done = subprocess.run([str(REPO / ".venv" / "bin" / "aenv"), "kill", "--metadata",
                           "run=harbor-crash"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 3
    assert running(node) == []
