"""One real node (gVisor sandboxes) for the ``aenv.rl`` tests, a fix-the-failing-test task,
and a client whose run must leave nothing on the node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from aenv.client import AsyncClient
from aenv.rl import RolloutEnv, Task
from tests.node_fixtures import config_dir, labelled, node
from tests.server.harness import API_KEY, NodeServer

__all__ = ["config_dir", "node"]  # the fixtures, for the tests

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
           # -B: a bytecode cache written now would outlive a same-size fix made within the
           # same second (its key is the source's size and mtime in whole seconds).
           f"cd {REPO} && ! python3 -B -m unittest -q 2>/dev/null"),  # it does fail
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


#: The node's sandboxes carrying labels (all of them without).
on_node = labelled


@pytest.fixture
async def client(node: NodeServer) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.url, API_KEY) as c:
        yield c
    assert on_node(node, run=c.run_id) == [], "the client's exit left sandboxes of its run"
