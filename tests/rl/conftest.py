"""One real node (gVisor sandboxes) for the ``aenv.rl`` tests, a fix-the-failing-test task,
and a client whose run must leave nothing on the node."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from aenv.client import AsyncClient
from aenv.rl import RolloutEnv, Task
from tests.server.harness import API_KEY, NodeServer, serving

REPO = "/home/user/repo"

CALC = "def add(a, b):\n    return a - b\n"
TEST = """import unittest

from calc import add


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
"""

#: A small git repository with one failing test: the usual SWE-style task.
TASK = Task(
    files={f"{REPO}/calc.py": CALC, f"{REPO}/test_calc.py": TEST},
    setup=(f"cd {REPO} && git init -q && git add -A && "
           "git -c user.email=t@t -c user.name=t commit -qm 'a failing test'",
           f"cd {REPO} && ! python3 -m unittest -q 2>/dev/null"),  # it does fail
    prompt="Fix the failing test in /home/user/repo.",
)
#: Passing tests (exit 0) score 1.0, failing ones 0.0.
REWARD = f"cd {REPO} && python3 -m unittest -q"


class ScriptedAgent:
    """Even-numbered rollouts fix the bug (and add a note); odd ones only look around."""

    async def act(self, env: RolloutEnv) -> None:
        await env.run("git status --short", cwd=REPO)
        source = await env.read_file(f"{REPO}/calc.py")
        assert "a - b" in source
        if env.index % 2 == 0:
            await env.edit(f"{REPO}/calc.py", "a - b", "a + b")
            await env.write_file(f"{REPO}/NOTES.md", "fixed add\n")
        else:
            await env.run("python3 -m unittest -q", cwd=REPO)


@pytest.fixture(scope="session")
def node() -> Iterator[NodeServer]:
    with serving() as server:
        yield server


@pytest.fixture(autouse=True)
def config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads (or writes) the user's own ``~/.config/aenv``."""
    path = tmp_path / "aenv-config"
    monkeypatch.setenv("AENV_CONFIG_DIR", str(path))
    return path


def on_node(server: NodeServer, **labels: str) -> list[str]:
    """Ids of the node's sandboxes (running or paused) carrying ``labels``, over plain HTTP."""
    query = "&".join(f"{k}={v}" for k, v in labels.items())
    response = httpx.get(f"{server.url}/v2/sandboxes",
                         params={"metadata": query} if query else None,
                         headers={"X-API-KEY": API_KEY}, timeout=30)
    response.raise_for_status()
    return sorted(s["sandboxID"] for s in response.json())


@pytest.fixture
async def client(node: NodeServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.url, API_KEY) as c:
        yield c
    assert on_node(node, run=c.run_id) == [], "the client's exit left sandboxes of its run"
