"""Run-scoped cleanup with real processes: a trainer (a child Python process) creates three
sandboxes labelled ``run=<id>``, then

* is SIGKILLed: nothing of it can run, its sandboxes stay, ``kill_by_metadata(run=<id>)``
  removes them;
* is SIGTERMed (async client) or SIGINTed (sync client): its handler kills them itself;
* returns without closing its client: ``atexit`` kills them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from aenv.client import AsyncClient
from tests.client.conftest import labelled
from tests.server.harness import API_KEY, REPO, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]

ASYNC_TRAINER = """
import asyncio, sys
from aenv.client import AsyncClient

async def main():
    client = AsyncClient(run_id=sys.argv[1])  # URL and key from E2B_API_URL / E2B_API_KEY
    sandboxes = await asyncio.gather(*(client.create(timeout=300) for _ in range(3)))
    print(" ".join(s.sandbox_id for s in sandboxes), flush=True)
    if sys.argv[2] == "wait":
        await asyncio.sleep(3600)

asyncio.run(main())
"""

SYNC_TRAINER = """
import sys, time
from aenv.client.sync import Client

client = Client(run_id=sys.argv[1])
sandboxes = [client.create(timeout=300) for _ in range(3)]
print(" ".join(s.sandbox_id for s in sandboxes), flush=True)
time.sleep(3600)
"""


def _trainer(node: NodeServer, script: str, run_id: str, mode: str = "wait"
             ) -> tuple[subprocess.Popen[str], list[str]]:
    env = {**os.environ, "E2B_API_URL": node.url, "E2B_API_KEY": API_KEY,
           "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen([sys.executable, "-c", script, run_id, mode], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=REPO)
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        child.wait(30)
        pytest.fail(f"the trainer died ({child.returncode}): {child.stderr.read()}"
                    if child.stderr else "the trainer died")
    ids = sorted(line.split())
    assert len(ids) == 3
    return child, ids


def _finish(child: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, err


def run_id() -> str:
    return "t-" + uuid.uuid4().hex[:10]


async def test_a_sigkilled_trainer_is_cleaned_up_by_its_label(node: NodeServer) -> None:
    run = run_id()
    child, ids = _trainer(node, ASYNC_TRAINER, run)
    child.send_signal(signal.SIGKILL)
    code, _ = _finish(child)
    assert code == -signal.SIGKILL
    assert labelled(node, run=run) == ids  # nothing could clean up
    async with AsyncClient(node.url, API_KEY) as janitor:
        assert sorted(await janitor.kill_by_metadata(run=run)) == ids
    assert labelled(node, run=run) == []


def test_a_sigtermed_trainer_cleans_up_itself(node: NodeServer) -> None:
    run = run_id()
    child, ids = _trainer(node, ASYNC_TRAINER, run)
    assert labelled(node, run=run) == ids
    child.send_signal(signal.SIGTERM)
    code, err = _finish(child)
    assert code == -signal.SIGTERM, err  # it still dies of the signal
    assert labelled(node, run=run) == [], err


def test_a_sigint_to_a_sync_trainer_cleans_up(node: NodeServer) -> None:
    run = run_id()
    child, ids = _trainer(node, SYNC_TRAINER, run)
    assert labelled(node, run=run) == ids
    child.send_signal(signal.SIGINT)
    code, err = _finish(child)
    assert code != 0 and "KeyboardInterrupt" in err, err  # the usual Ctrl-C, after cleanup
    assert labelled(node, run=run) == [], err


def test_a_trainer_that_forgot_to_close_is_cleaned_up_at_exit(node: NodeServer) -> None:
    run = run_id()
    child, _ = _trainer(node, ASYNC_TRAINER, run, mode="return")
    code, err = _finish(child)
    assert code == 0, err
    assert labelled(node, run=run) == [], err


def test_the_sync_client_from_threads(node: NodeServer, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from aenv.client.sync import Client

    with Client(node.url, API_KEY) as client:
        def rollout(i: int) -> str:
            with client.create(timeout=120) as sbx:
                sbx.write_file("/tmp/i", str(i))
                return sbx.run("cat /tmp/i").stdout

        with ThreadPoolExecutor(4) as pool:
            assert sorted(pool.map(rollout, range(4))) == ["0", "1", "2", "3"]
        kept = client.create(timeout=120)
        children = kept.fork(2)
        assert len(children) == 2 and children.errors == []
        assert len(labelled(node, run=client.run_id)) == 3
    assert labelled(node, run=client.run_id) == []  # close() killed the run
