"""The built-in ``code-interpreter-v1`` template on a real node, driven by the official
``e2b-code-interpreter`` SDK (issue 23): the node builds the template itself at start
(``settings.code_interpreter``), then the SDK's ``Sandbox.create()`` — which asks for that
template and talks to port 49999 through the node's proxy — runs cells whose state lasts,
returns rich results, and keeps its kernel's state across pause/resume and in fork children.

The first build on a machine downloads ~150 MB from PyPI and npm and takes minutes; later
ones reuse the shared layer cache and only make the memory image again.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox

from aenv.client.sync import Client
from tests.server.harness import API_KEY, NodeServer, serving
from tests.server.templates_ready import TemplateBuildFailed, wait_ready

#: A cold build (pip and npm downloads, then the memory image) on 2 busy cores.
BUILD_WITHIN_S = 1200.0
NAME = "code-interpreter-v1"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with serving(code_interpreter="true") as server:
        try:
            wait_ready(server, NAME, BUILD_WITHIN_S)
        except TemplateBuildFailed as exc:
            pytest.fail(str(exc))
        yield server


@pytest.fixture
def sandbox(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=300)
    try:
        yield sbx
    finally:
        sbx.kill()


def test_state_across_cells_and_rich_results(sandbox: Sandbox) -> None:
    sandbox.run_code("x = 41")
    assert sandbox.run_code("x + 1").text == "42"
    frame = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert frame.error is None, frame.error
    assert "<table" in (frame.results[0].html or "")
    chart = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6]); plt.title('rising'); plt.show()")
    assert chart.error is None, chart.error
    png = [r for r in chart.results if r.png]
    assert png, chart.results
    assert png[0].chart is not None and png[0].chart.title == "rising"
    failed = sandbox.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    assert "ZeroDivisionError" in failed.error.traceback


def test_languages_from_the_template(sandbox: Sandbox) -> None:
    js = sandbox.create_code_context(language="javascript")
    assert sandbox.run_code("const n = 6 * 7; n", context=js).text == "42"
    bash = sandbox.run_code("echo $((6 * 7))", language="bash")
    assert bash.logs.stdout == ["42\n"]


def test_state_survives_pause_and_resume(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = [1, 2, 3]")
    sandbox.pause()
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.run_code("sum(kept)").text == "6"


def test_fork_children_see_the_prepared_variables(node: NodeServer, sandbox: Sandbox) -> None:
    sandbox.run_code("import numpy as np\nprepared = np.arange(10)")
    with Client(node.url, API_KEY) as client:
        children = client.fork(sandbox.sandbox_id, 3, timeout=300)
        assert not children.errors, children.errors
        try:
            for i, child in enumerate(children):
                interpreter = Sandbox.connect(child.sandbox_id)
                assert interpreter.run_code(f"int(prepared.sum()) + {i}").text == str(45 + i)
            # Each child is its own kernel: a change in one is not seen by the others.
            Sandbox.connect(children[0].sandbox_id).run_code("prepared = None")
            assert Sandbox.connect(children[1].sandbox_id).run_code(
                "int(prepared.sum())").text == "45"
            assert sandbox.run_code("int(prepared.sum())").text == "45"
        finally:
            for child in children:
                child.kill()


def test_the_js_sdk(node: NodeServer) -> None:
    """The official ``@e2b/code-interpreter`` (tests/js, pinned) against the node:
    tests/js/interpreter_smoke.mjs prints one JSON summary."""
    import json
    import os
    import shutil
    import subprocess

    from tests.envd.test_js_sdk import JS_DIR, ensure_node_modules
    from tests.server.harness import client_env

    node_bin = shutil.which("node")
    assert node_bin, "node is required (make test installs it)"
    ensure_node_modules()
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(client_env(node))
    done = subprocess.run([node_bin, "interpreter_smoke.mjs"], cwd=JS_DIR, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary; stdout={done.stdout!r} stderr={done.stderr[-2000:]!r}"
    summary = json.loads(lines[-1])
    assert summary["ok"], summary
    assert done.returncode == 0
