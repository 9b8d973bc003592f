"""Real pseudo-terminals through the SDK: input, resize, kill, tty semantics."""

from __future__ import annotations

import pytest
from e2b import AsyncSandbox, PtySize, Sandbox


def _collect(handle) -> str:  # type: ignore[no-untyped-def]
    chunks: list[bytes] = []
    try:
        handle.wait(on_pty=chunks.append)
    except Exception:  # a pty shell ending by `exit 3` raises; output is what we check
        pass
    return b"".join(chunks).decode("utf-8", "replace")


def test_pty_runs_an_interactive_shell(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(handle.pid, b"echo $((6*7)); tty; echo $TERM\n")
    sandbox.pty.send_stdin(handle.pid, b"exit\n")
    out = _collect(handle)
    assert "42" in out
    assert "/dev/pts/" in out
    assert "xterm-256color" in out


def test_pty_resize(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.resize(handle.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(handle.pid, b"stty size\nexit\n")
    assert "30 100" in _collect(handle)


def test_pty_kill(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    assert handle.pid in {p.pid for p in sandbox.commands.list()}
    assert sandbox.pty.kill(handle.pid) is True
    _collect(handle)
    assert handle.pid not in {p.pid for p in sandbox.commands.list()}


def test_pty_ctrl_c_interrupts_foreground_job(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(handle.pid, b"sleep 50\n")
    import time

    time.sleep(0.5)
    sandbox.pty.send_stdin(handle.pid, b"\x03")
    sandbox.pty.send_stdin(handle.pid, b"echo after-$((1+1))\nexit\n")
    assert "after-2" in _collect(handle)


def test_pty_as_root(sandbox: Sandbox) -> None:
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), user="root")
    sandbox.pty.send_stdin(handle.pid, b"echo uid=$(id -u)\nexit\n")
    assert "uid=0\r\n" in _collect(handle)


@pytest.mark.anyio
async def test_async_pty(async_sandbox: AsyncSandbox) -> None:
    chunks: list[bytes] = []
    handle = await async_sandbox.pty.create(
        PtySize(rows=24, cols=80), on_data=chunks.append
    )
    await async_sandbox.pty.send_stdin(handle.pid, b"echo async-$((2+3))\nexit\n")
    await handle.wait()
    assert "async-5" in b"".join(chunks).decode()
