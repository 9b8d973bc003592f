"""process.Process through the official synchronous SDK: run, background, stdin, kill, list."""

from __future__ import annotations

import time

import pytest
from e2b import (
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    TimeoutException,
)


def _wait_until(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_run_returns_stdout_stderr_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2")
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 0
    assert result.error is None


def test_nonzero_exit_raises_with_output(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "partial\n"
    assert info.value.stderr == "bad\n"
    assert info.value.error == "exit status 3"


def test_default_user_home_and_root(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("id -un; pwd; echo $HOME").stdout == (
        "user\n/home/user\n/home/user\n"
    )
    assert sandbox.commands.run("id -un; echo $HOME", user="root").stdout == "root\n/root\n"


def test_cwd(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("pwd", cwd="/does/not/exist")


def test_envs_are_per_process(sandbox: Sandbox) -> None:
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout == "bar\n"
    assert sandbox.commands.run("echo \"[$FOO]\"").stdout == "[]\n"


def test_streaming_callbacks_arrive_in_order(sandbox: Sandbox) -> None:
    chunks: list[str] = []
    errors: list[str] = []
    sandbox.commands.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.05; done",
        on_stdout=chunks.append,
        on_stderr=errors.append,
    )
    assert "".join(chunks) == "1\n2\n3\n"
    assert "".join(errors) == "e1\ne2\ne3\n"


def test_background_command_and_wait(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 0.3; echo done", background=True)
    assert handle.pid > 0
    result = handle.wait()
    assert result.stdout == "done\n"


def test_list_shows_background_processes(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        listed = {p.pid: p for p in sandbox.commands.list()}
        assert handle.pid in listed
        info = listed[handle.pid]
        assert info.cmd == "/bin/bash"
        assert info.args == ["-l", "-c", "sleep 30"]
        assert info.cwd == "/home/user"
    finally:
        assert sandbox.commands.kill(handle.pid) is True
    assert _wait_until(lambda: handle.pid not in {p.pid for p in sandbox.commands.list()})


def test_kill_reports_signal_and_kills_the_tree(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 101 & sleep 102; wait", background=True)
    assert _wait_until(lambda: "sleep 101" in sandbox.commands.run("ps -eo args").stdout)
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as info:
        handle.wait()
    assert info.value.exit_code == -1
    assert info.value.error == "signal: killed"
    assert _wait_until(lambda: "sleep 10" not in sandbox.commands.run("ps -eo args").stdout)


def test_kill_unknown_pid_returns_false(sandbox: Sandbox) -> None:
    assert sandbox.commands.kill(999_999) is False


def test_disconnect_then_reconnect(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "sleep 0.3; for i in 1 2 3; do echo line$i; sleep 0.1; done", background=True
    )
    handle.disconnect()
    assert handle.pid in {p.pid for p in sandbox.commands.list()}
    again = sandbox.commands.connect(handle.pid)
    result = again.wait()
    assert result.exit_code == 0
    assert "line3\n" in result.stdout


def test_connect_to_finished_process_gets_its_exit(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("exit 0", background=True)
    handle.wait()
    assert sandbox.commands.connect(handle.pid).wait().exit_code == 0


def test_connect_unknown_pid(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)


def test_timeout_kills_the_process(sandbox: Sandbox) -> None:
    marker = f"sleep 7{time.monotonic_ns() % 1000:03d}"
    with pytest.raises(TimeoutException):
        sandbox.commands.run(marker, timeout=1)
    # Connect-Timeout-Ms is the process lifetime: envd kills it, not just the stream.
    assert _wait_until(lambda: marker not in sandbox.commands.run("ps -eo args").stdout)


def test_stdin_send_and_close(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello ")
    sandbox.commands.send_stdin(handle.pid, b"world\n")
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "hello world\n"


def test_stream_input_keeps_order(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(handle.pid, (f"{i}," for i in range(100)))
    sandbox.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "".join(f"{i}," for i in range(100))


def test_stdin_closed_by_default(sandbox: Sandbox) -> None:
    # stdin=False means /dev/null: `cat` must not hang.
    assert sandbox.commands.run("cat", timeout=10).stdout == ""


def test_send_stdin_to_unknown_pid(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(999_999, "x")


def test_broken_utf8_is_passed_through(sandbox: Sandbox) -> None:
    result = sandbox.commands.run(r"printf 'ok\xff\xfe end'")
    assert result.stdout.startswith("ok")
    assert result.stdout.endswith(" end")
    assert "\ufffd" in result.stdout


def test_large_output(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("head -c 3000000 /dev/zero | tr '\\0' a")
    assert len(result.stdout) == 3_000_000


def test_many_sequential_commands(sandbox: Sandbox) -> None:
    for i in range(30):
        assert sandbox.commands.run(f"echo {i}").stdout == f"{i}\n"


def test_bad_user(sandbox: Sandbox) -> None:
    with pytest.raises(Exception, match="invalid username"):
        sandbox.commands.run("true", user="no-such-user")  # type: ignore[arg-type]


def test_without_exec_helper_users_and_ptys_still_work() -> None:
    """Source-tree envd without the bundle's exec-as helper falls back to Popen's own user
    switch (slower, same behaviour)."""
    from e2b import PtySize

    from tests.conftest import free_port
    from tests.envd.conftest import sdk_sandbox
    from tests.envd.harness import start_envd

    envd = start_envd(free_port(), exec_helper=False)
    try:
        sbx = sdk_sandbox(envd.url)
        assert sbx.commands.run("id -un").stdout == "user\n"
        assert sbx.commands.run("id -un", user="root").stdout == "root\n"
        handle = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(handle.pid, b"tty; exit\n")
        chunks: list[bytes] = []
        handle.wait(on_pty=chunks.append)
        assert b"/dev/pts/" in b"".join(chunks)
    finally:
        envd.stop()
