"""The default Python context through the official SDK: state, results, charts, errors,
streams, env vars, timeouts, the async client."""

from __future__ import annotations

import base64
import re
import time

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import BarChart, LineChart
from e2b_code_interpreter.models import OutputMessage

from tests.interpreter.conftest import InterpreterServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def sbx(interpreter: InterpreterServer) -> Sandbox:
    return Sandbox.create()


def test_state_survives_across_cells(sbx: Sandbox) -> None:
    sbx.run_code("state_value = 20")
    execution = sbx.run_code("state_value * 2 + 2")
    assert execution.error is None
    assert execution.text == "42"
    assert execution.results[0].is_main_result


def test_execution_count_increments(sbx: Sandbox) -> None:
    first = sbx.run_code("1")
    second = sbx.run_code("2")
    assert first.execution_count is not None and second.execution_count is not None
    assert second.execution_count == first.execution_count + 1


def test_a_string_result_is_its_text(sbx: Sandbox) -> None:
    # E2B's server strips the repr's quotes; code compares `.text` with the bare string.
    assert sbx.run_code("'hello'").text == "hello"


def test_matplotlib_line_and_bar_charts(sbx: Sandbox) -> None:
    code = """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [2, 4, 8], label="growth")
ax.set_title("Growth")
ax.set_xlabel("time (s)")
ax.set_ylabel("size")
plt.show()
fig, ax = plt.subplots()
ax.bar(["apples", "pears"], [3, 5], label="fruit")
ax.set_title("Fruit")
plt.show()
"""
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    line, bar = execution.results
    assert base64.b64decode(line.png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert isinstance(line.chart, LineChart)
    assert line.chart.title == "Growth"
    assert (line.chart.x_label, line.chart.x_unit, line.chart.y_label) == ("time (s)", "s", "size")
    assert line.chart.elements[0].label == "growth"
    assert line.chart.elements[0].points == [(1.0, 2.0), (2.0, 4.0), (3.0, 8.0)]
    assert bar.png
    assert isinstance(bar.chart, BarChart)
    assert bar.chart.title == "Fruit"
    assert [(e.label, e.value, e.group) for e in bar.chart.elements] == [
        ("apples", 3.0, "fruit"), ("pears", 5.0, "fruit")]


def test_a_figure_with_nothing_recognisable_is_unknown(sbx: Sandbox) -> None:
    code = """
import matplotlib.pyplot as plt, numpy as np
fig, ax = plt.subplots()
ax.imshow(np.eye(3))
ax.set_title("An image")
plt.show()
"""
    (result,) = sbx.run_code(code).results
    assert result.png and result.chart is not None
    assert (result.chart.type.value, result.chart.title) == ("unknown", "An image")


def test_pandas_dataframe_html_and_data(sbx: Sandbox) -> None:
    execution = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert result.is_main_result
    assert "<table" in result.html and "<td>x</td>" in result.html
    assert result.data == {"a": [1, 2], "b": ["x", "y"]}
    assert "a" in result.text


def test_an_exception_has_name_value_and_traceback(sbx: Sandbox) -> None:
    errors = []
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    # IPython's traceback, with its colours, as Jupyter sends it.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", execution.error.traceback)
    assert "ZeroDivisionError" in plain
    assert "----> 2     return 1 / 0" in plain
    assert errors == [execution.error]


def test_stdout_and_stderr_reach_the_callbacks(sbx: Sandbox) -> None:
    out: list[OutputMessage] = []
    err: list[OutputMessage] = []
    code = "import sys\nprint('to out')\nprint('to err', file=sys.stderr)"
    execution = sbx.run_code(code, on_stdout=out.append, on_stderr=err.append)
    assert execution.logs.stdout == ["to out\n"]
    assert execution.logs.stderr == ["to err\n"]
    assert [m.line for m in out] == ["to out\n"] and not out[0].error
    assert [m.line for m in err] == ["to err\n"] and err[0].error
    assert out[0].timestamp  # the kernel message's time


def test_env_vars_per_call_do_not_leak(sbx: Sandbox) -> None:
    read = "import os\nos.environ.get('CALL_VAR'), os.environ.get('INTERPRETER_TEST_MARK')"
    with_env = sbx.run_code(read, envs={"CALL_VAR": "it's set", "INTERPRETER_TEST_MARK": "over"})
    assert with_env.text == "(\"it's set\", 'over')"
    after = sbx.run_code(read)
    # Unset again, and the server's own value back.
    assert after.text == "(None, 'from-the-server')"


def test_a_timeout_interrupts_the_cell(sbx: Sandbox) -> None:
    sbx.run_code("interrupted_marker = 'before'")
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\ntime.sleep(60)\ninterrupted_marker = 'after'", timeout=2)
    assert time.monotonic() - started < 10
    started = time.monotonic()
    execution = sbx.run_code("interrupted_marker", timeout=20)
    # Answered at once: the sleeping cell was interrupted, not waited for; state is kept.
    assert time.monotonic() - started < 5
    assert execution.text == "before"


@pytest.mark.anyio
async def test_async_sdk_streams_output(interpreter: InterpreterServer) -> None:
    sbx = await AsyncSandbox.create()
    seen: list[tuple[str, float]] = []

    async def on_stdout(message: OutputMessage) -> None:
        seen.append((message.line, time.monotonic()))

    code = "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')\n'done'"
    started = time.monotonic()
    execution = await sbx.run_code(code, on_stdout=on_stdout)
    finished = time.monotonic()
    assert [line for line, _ in seen] == ["first\n", "second\n"]
    # The first line arrived while the cell was still sleeping: streamed, not batched.
    assert seen[0][1] - started < finished - started - 1.0
    assert execution.text == "done"
