"""The built-in ``code-interpreter-v1`` template on a real node, driven by the official
``e2b-code-interpreter`` SDK (issue 23): the node builds the template itself at start
(``settings.code_interpreter``), then the SDK's ``Sandbox.create()`` — which asks for that
template and talks to port 49999 through the node's proxy — runs cells whose state lasts,
returns rich results, and keeps its kernel's state across pause/resume and in fork children.

R through the same SDK: state across cells, printed values and data frames, errors, base-R
plots, env vars per call (R's kernel is only in the template, so these run here).

The first build on a machine downloads ~150 MB from PyPI and npm and ~50 MB of R's Debian
packages and takes minutes; later ones reuse the shared layer cache and only make the memory
image again.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.models import Context

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

    from tests.js_sdk import JS_DIR, ensure_node_modules
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


# -- R (its kernel comes from the Debian packages the template installs; R is not on the
# host, so these run here, in the template's sandboxes, not in tests/interpreter) --------


@pytest.fixture(scope="module")
def r_sandbox(node: NodeServer) -> Iterator[Sandbox]:
    sbx = Sandbox.create(timeout=600)
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest.fixture
def r(r_sandbox: Sandbox) -> Iterator[Context]:
    context = r_sandbox.create_code_context(language="r")
    try:
        yield context
    finally:
        r_sandbox.remove_code_context(context)


def test_r_state_across_cells_and_contexts(r_sandbox: Sandbox, r: Context) -> None:
    assert r.language == "r"
    first = r_sandbox.run_code("x <- 41", context=r)
    assert first.error is None and first.results == []
    second = r_sandbox.run_code("x + 1", context=r)
    assert second.error is None, second.error
    # IRkernel shows a value as display_data, not as an execute_result (E2B's server
    # forwards it the same way): a result, but not the main one.
    assert [res.text for res in second.results] == ["[1] 42"]
    assert second.execution_count == first.execution_count + 1
    # Another context is another R process.
    other = r_sandbox.create_code_context(language="r")
    try:
        missing = r_sandbox.run_code("exists('x')", context=other)
        assert [res.text for res in missing.results] == ["[1] FALSE"]
    finally:
        r_sandbox.remove_code_context(other)


def test_r_values_data_frames_and_printed_output(r_sandbox: Sandbox, r: Context) -> None:
    frame = r_sandbox.run_code("data.frame(n = 1:3, sq = (1:3)^2)", context=r)
    assert frame.error is None, frame.error
    (result,) = frame.results
    # repr's own text layout (columns padded, not print()'s alignment).
    assert [line.split() for line in (result.text or "").splitlines()] == [
        ["n", "sq"], ["1", "1", "1"], ["2", "2", "4"], ["3", "3", "9"]]
    assert "<table" in (result.html or "") and "A data.frame: 3" in (result.html or "")
    # No context: the default R context, started at its first use, as E2B's server does.
    printed = r_sandbox.run_code('print("Hello, World!"); cat("done\\n")', language="r")
    assert printed.error is None, printed.error
    assert printed.logs.stdout == ['[1] "Hello, World!"\n', "done\n"]
    assert r_sandbox.run_code("message('to stderr')", context=r).logs.stderr == ["to stderr\n\n"]


def test_an_r_error_is_an_execution_error(r_sandbox: Sandbox, r: Context) -> None:
    failed = r_sandbox.run_code("f <- function() stop('boom')\nf()", context=r)
    assert failed.error is not None
    assert failed.error.name == "ERROR"
    assert failed.error.value == "Error in f(): boom\n"
    assert "Traceback:" in failed.error.traceback
    assert "1. f()" in failed.error.traceback and 'stop("boom")' in failed.error.traceback
    # The context is intact after the error.
    assert [res.text for res in r_sandbox.run_code("1 + 1", context=r).results] == ["[1] 2"]


def test_a_base_r_plot_is_a_png(r_sandbox: Sandbox, r: Context) -> None:
    plotted = r_sandbox.run_code("plot(1:10)", context=r)
    assert plotted.error is None, plotted.error
    (result,) = plotted.results
    assert result.png is not None
    assert base64.b64decode(result.png).startswith(b"\x89PNG\r\n\x1a\n")
    assert result.text == "plot without title"


def test_r_env_vars_hold_for_one_call(r_sandbox: Sandbox, r: Context) -> None:
    read = "Sys.getenv('AENV_R_VAR', unset = 'unset')"
    called = r_sandbox.run_code(read, context=r, envs={"AENV_R_VAR": "bar"})
    assert [res.text for res in called.results] == ['[1] "bar"']
    assert [res.text for res in r_sandbox.run_code(read, context=r).results] == ['[1] "unset"']
