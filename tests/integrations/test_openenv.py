"""OpenEnv's own client (``EnvClient.from_docker_image(..., provider=...)``) on a real node
through ``aenv.integrations.openenv``.

Two tasks (``openenv_env/``: one OpenEnv server written with OpenEnv's ``create_app``, one
question per template), 4 rollouts each, run from 8 threads with OpenEnv's sync client: each
resets, answers wrong (reward 0.0, not done), then right (reward 1.0, done). The node built
each template once, prepared one parent per template, and forked the 8 episodes from the two;
nothing runs afterwards.

The template installs openenv from wheels downloaded here on the host (a build's RUN steps
reach no package index): openenv without its dependencies (its client side pulls in gradio,
pandas...), plus what its server imports.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from aenv.integrations.openenv import AenvOpenEnv
from tests.integrations.openenv_env.client import QuestionEnv
from tests.integrations.openenv_env.models import AnswerAction
from tests.server.harness import API_KEY, CACHE, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(1200)]

ENV_DIR = Path(__file__).with_name("openenv_env")
#: image name → (the task's Dockerfile, its question's answer)
TASKS = {"sum-env": ("sum.Dockerfile", "5"), "capital-env": ("capital.Dockerfile", "Paris")}
ROLLOUTS = 4
#: What the server inside the template needs (openenv itself goes in with --no-deps).
SERVER_DEPS = ["fastmcp>=3,<4", "fastapi>=0.116", "uvicorn>=0.24", "websockets>=15.0.1",
               "pydantic>=2"]
_FORKED = re.compile(r"forked (\S+) into (\d+)/(\d+)")


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving() as server:
        yield server


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context: the env's sources and the wheels it installs."""
    ctx = tmp_path_factory.mktemp("openenv-ctx")
    shutil.copytree(ENV_DIR, ctx, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "client.py"))
    # Downloaded once per machine (what to download names the directory), then copied.
    key = hashlib.sha256(" ".join(["openenv==0.10.0", *SERVER_DEPS]).encode()).hexdigest()[:12]
    cached = CACHE / f"openenv-wheels-{key}"
    if not (cached / ".complete").exists():
        partial = cached.with_name(cached.name + f".{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(partial)]
        for argv in ([*pip, "--no-deps", "openenv==0.10.0"], [*pip, *SERVER_DEPS]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                                  check=False)
            assert done.returncode == 0, done.stderr[-3000:]
        (partial / ".complete").touch()
        shutil.rmtree(cached, ignore_errors=True)
        partial.rename(cached)
    shutil.copytree(cached, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
    return ctx


def running(node: NodeServer) -> list[dict[str, Any]]:
    response = httpx.get(f"{node.url}/v2/sandboxes", headers={"X-API-KEY": API_KEY},
                         params={"state": "running,paused"}, timeout=10)
    response.raise_for_status()
    return list(response.json())


def rollout(envs: AenvOpenEnv, image: str, answer: str) -> list[tuple[float | None, bool]]:
    """One episode with OpenEnv's sync client: reset, a wrong answer, the right one."""
    client = QuestionEnv.from_docker_image(image, provider=envs.provider()).sync()
    try:
        first = client.reset()
        assert first.observation.question and not first.done
        wrong = client.step(AnswerAction(answer="no idea"))
        right = client.step(AnswerAction(answer=answer))
        return [(first.reward, first.done), (wrong.reward, wrong.done),
                (right.reward, right.done)]
    finally:
        client.close()  # OpenEnv calls provider.stop_container(): the child is killed


def test_2_tasks_x_4_rollouts_fork_from_prepared_parents(node: NodeServer,
                                                         context: Path) -> None:
    run_id = f"openenv-{uuid.uuid4().hex[:8]}"
    dockerfiles = {image: (context, context / dockerfile)
                   for image, (dockerfile, _) in TASKS.items()}
    started = time.monotonic()
    with AenvOpenEnv(dockerfiles=dockerfiles, run_id=run_id) as envs:
        with ThreadPoolExecutor(len(TASKS) * ROLLOUTS) as threads:
            jobs = [(image, threads.submit(rollout, envs, image, answer))
                    for image, (_, answer) in TASKS.items() for _ in range(ROLLOUTS)]
            results = [(image, job.result()) for image, job in jobs]
        print(f"8 rollouts in {time.monotonic() - started:.1f} s "
              f"(templates built: {envs.built})")
        for image, steps in results:
            assert steps == [(0.0, False), (0.0, False), (1.0, True)], (image, steps)
        # Each episode's child is gone once its client closed; the parents stay until close.
        assert {s["sandboxID"] for s in running(node)} == set(envs.parents)
        assert len(envs.built) == 2
        assert len(envs.parents) == 2
        assert len(set(envs.children)) == 8
    # One prepared parent per template; the 8 episodes are fork children of the two.
    forked: Counter[str] = Counter()
    for parent, ok, wanted in _FORKED.findall(node.log()):
        assert ok == wanted
        forked[parent] += int(ok)
    assert set(forked) == set(envs.parents) and sum(forked.values()) == 8, forked
    assert running(node) == []
