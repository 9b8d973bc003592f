"""Contexts and the other languages through the official SDK: create, list, restart, remove,
cwd and env per context, unknown ids and languages; bash; JavaScript and TypeScript (Deno)."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.models import Context

from tests.interpreter.conftest import InterpreterServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def sbx(interpreter: InterpreterServer) -> Sandbox:
    return Sandbox.create()


def test_context_lifecycle(sbx: Sandbox, interpreter: InterpreterServer) -> None:
    workdir = interpreter.cwd / "ctx-lifecycle"
    workdir.mkdir()
    context = sbx.create_code_context(cwd=str(workdir), language="python")
    assert (context.language, context.cwd) == ("python", str(workdir))
    assert context.id in [c.id for c in sbx.list_code_contexts()]

    assert sbx.run_code("import os\nos.getcwd()", context=context).text == str(workdir)
    sbx.run_code("kept = 1", context=context)
    assert sbx.run_code("kept", context=context).text == "1"
    # Contexts are separate kernels: the default one does not see it.
    assert sbx.run_code("'kept' in globals()").text == "False"

    sbx.restart_code_context(context)
    after = sbx.run_code("kept", context=context)
    assert after.error is not None and after.error.name == "NameError"
    listed = {c.id: c for c in sbx.list_code_contexts()}
    assert listed[context.id].cwd == str(workdir)

    sbx.remove_code_context(context.id)
    assert context.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=context)


def test_unknown_context_is_not_found(sbx: Sandbox) -> None:
    ghost = Context(context_id="no-such-context", language="python", cwd="/")
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ghost)
    with pytest.raises(NotFoundException):
        sbx.restart_code_context("no-such-context")
    with pytest.raises(NotFoundException):
        sbx.remove_code_context("no-such-context")


def test_languages_that_are_not_there_are_refused(sbx: Sandbox,
                                                  interpreter: InterpreterServer) -> None:
    with pytest.raises(SandboxException, match=r"400 Bad Request: language 'cobol'"):
        sbx.run_code("1", language="cobol")
    # The test venv installs no IR kernel (nor does a machine-wide one exist here).
    assert not (interpreter.venv / "share" / "jupyter" / "kernels" / "ir").exists()
    with pytest.raises(SandboxException, match="language r is not installed in this template"):
        sbx.create_code_context(language="r")


def test_env_vars_per_context(interpreter: InterpreterServer, sbx: Sandbox) -> None:
    # The SDKs' create_code_context sends no env vars; the server takes them from the body.
    reply = httpx.post(f"{interpreter.url}/contexts",
                       json={"language": "python", "env_vars": {"CONTEXT_VAR": "ctx"}})
    assert reply.status_code == 200, reply.text
    context = Context.from_json(reply.json())
    read = "import os\nstr(os.environ.get('CONTEXT_VAR'))"
    assert sbx.run_code(read, context=context).text == "ctx"
    # A call's own value wins for that call only.
    assert sbx.run_code(read, context=context, envs={"CONTEXT_VAR": "call"}).text == "call"
    assert sbx.run_code(read, context=context).text == "ctx"
    assert sbx.run_code(read).text == "None"
    sbx.remove_code_context(context)


def test_bash(sbx: Sandbox, interpreter: InterpreterServer) -> None:
    execution = sbx.run_code("echo hello in $(pwd)", language="bash")
    assert execution.error is None
    assert execution.logs.stdout == [f"hello in {interpreter.cwd}\n"]
    sbx.run_code("BASH_STATE=kept", language="bash")
    assert sbx.run_code("echo $BASH_STATE", language="bash").logs.stdout == ["kept\n"]
    env = sbx.run_code("echo \"[$CALL_VAR]\"", language="bash", envs={"CALL_VAR": "a b'c"})
    assert env.logs.stdout == ["[a b'c]\n"]
    assert sbx.run_code("echo \"[$CALL_VAR]\"", language="bash").logs.stdout == ["[]\n"]
    first = sbx.run_code("true", language="bash").execution_count
    assert sbx.run_code("true", language="bash").execution_count == first + 1


def test_javascript_context(sbx: Sandbox, needs_deno: None) -> None:
    context = sbx.create_code_context(language="javascript")
    assert context.language == "javascript"
    sbx.run_code("const base = 40", context=context)
    out: list[str] = []
    execution = sbx.run_code("console.log('js says', base); base + 2", context=context,
                             on_stdout=lambda m: out.append(m.line))
    assert execution.error is None, execution.error
    assert execution.text == "42"
    assert out == ["js says 40\n"]
    error = sbx.run_code("throw new TypeError('nope')", context=context).error
    assert error is not None and (error.name, error.value) == ("TypeError", "nope")
    env = sbx.run_code("Deno.env.get('JS_VAR')", context=context, envs={"JS_VAR": "v"})
    assert env.text == "v"
    assert sbx.run_code("Deno.env.get('JS_VAR') ?? 'unset'", context=context).text == "unset"
    sbx.remove_code_context(context)


def test_typescript_by_language(sbx: Sandbox, needs_deno: None) -> None:
    code = "interface P { x: number }\nconst p: P = { x: 41 };\np.x + 1"
    execution = sbx.run_code(code, language="ts")
    assert execution.error is None, execution.error
    assert execution.text == "42"
    # The same default TypeScript context next time.
    assert sbx.run_code("p.x", language="typescript").text == "41"


def test_a_javascript_timeout_interrupts_the_cell_and_keeps_the_state(
        sbx: Sandbox, needs_deno: None) -> None:
    context = sbx.create_code_context(language="js")
    sbx.run_code("var kept = 41", context=context)
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", context=context, timeout=2)
    started = time.monotonic()
    # Interrupted by message (Deno ends the running script), not by a signal that would kill
    # the kernel: the loop is gone at once and the variables are still there.
    assert sbx.run_code("kept + 1", context=context, timeout=30).text == "42"
    assert time.monotonic() - started < 5
    sbx.remove_code_context(context)
