"""``aenv exec ID -- CMD…``: run a command in a sandbox as if it ran here.

* its stdout and stderr are written to ours as they arrive (the e2b SDK's ``on_stdout`` /
  ``on_stderr`` callbacks; output is text: envd's bytes decoded as UTF-8);
* our stdin is forwarded when it is not a terminal (a pipe or a file), and closed at its end,
  so ``tar c . | aenv exec ID -- tar x`` style pipelines work for text and ``cat`` sees EOF;
* its exit code is ours. A command killed by a signal exits ``128 + signal`` (as in a shell:
  envd reports ``exit -1, "signal: killed"``); past ``--timeout`` it is ended and we exit 124
  (``timeout(1)``'s code); a failure of the sandbox or the node is one ``error:`` line, exit 1;
* Ctrl-C kills the command in the sandbox and exits 130.

One argument is a shell command line (``aenv exec ID -- 'ls | wc -l'``); several are an argv,
quoted for the shell (``aenv exec ID -- ls -l "my dir"``). Both run under ``bash -l -c``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any, TextIO

import anyio
import anyio.to_thread
import typer
from e2b import AsyncCommandHandle, CommandExitException
from rich.text import Text

from aenv.cli.common import client, err, examples, fail, pairs, run
from aenv.client import ClientError, SandboxTimeout
from aenv.client.sandbox import envd_errors

#: Chunks of forwarded stdin: envd takes each as one ``SendInput`` call.
STDIN_CHUNK = 64 * 1024
#: The exit code past ``--timeout``, as ``timeout(1)``'s.
TIMED_OUT = 124

#: Go's names of signals (envd reports ``signal: <name>``), back to their numbers.
_SIGNALS = {
    "hangup": signal.SIGHUP, "interrupt": signal.SIGINT, "quit": signal.SIGQUIT,
    "illegal instruction": signal.SIGILL, "trace/breakpoint trap": signal.SIGTRAP,
    "aborted": signal.SIGABRT, "bus error": signal.SIGBUS,
    "floating point exception": signal.SIGFPE, "killed": signal.SIGKILL,
    "user defined signal 1": signal.SIGUSR1, "segmentation fault": signal.SIGSEGV,
    "user defined signal 2": signal.SIGUSR2, "broken pipe": signal.SIGPIPE,
    "alarm clock": signal.SIGALRM, "terminated": signal.SIGTERM,
}


def register(app: typer.Typer) -> None:
    app.command("exec", epilog=examples(
        "aenv exec i4c2… -- uname -a",
        "aenv exec i4c2… -- 'cd /srv && make test'",
        "aenv exec --cwd /home/user/repo --env CI=1 i4c2… -- pytest -q",
        "echo hello | aenv exec i4c2… -- wc -c",
        "aenv exec --user root --timeout 30 i4c2… -- apt-get update",
    ), context_settings={"allow_interspersed_args": False})(exec_)


def exit_code(code: int, error: str | None) -> int:
    """Our exit code for envd's ``code`` and ``error`` (a signal: ``128 + signal``)."""
    if code >= 0:
        return code & 0xFF
    if error and error.startswith("signal: "):
        name = error.removeprefix("signal: ").strip()
        number = _SIGNALS.get(name)
        if number is not None:
            return 128 + int(number)
        if name.startswith("signal ") and name[7:].isdigit():
            return 128 + int(name[7:])
    return 255


def exec_(
    sandbox_id: Annotated[str, typer.Argument(help="the sandbox's id", show_default=False)],
    command: Annotated[list[str], typer.Argument(help="the command (after --)",
                                                 show_default=False)],
    cwd: Annotated[str | None, typer.Option("--cwd", "-w", help="working directory")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", help="KEY=VALUE in its environment (repeatable)")] = None,
    user: Annotated[str | None, typer.Option("--user", "-u", help="run as this user")] = None,
    timeout_s: Annotated[float, typer.Option(
        "--timeout", min=0, help="seconds before it is ended (0: never)")] = 0,
) -> None:
    """Run a command in a sandbox: output streamed, stdin forwarded from a pipe, its exit
    code passed through."""
    envs = pairs(env, "--env")
    if command and command[0] == "--":  # kept by click once the sandbox id ended the options
        command = command[1:]
    if not command:
        fail("no command given (aenv exec ID -- CMD...)")
    line = command[0] if len(command) == 1 else shlex.join(command)
    forward = not sys.stdin.isatty()

    async def flow() -> int:
        async with client() as c:
            sbx = await c.connect(sandbox_id)
            what = f"exec in {sandbox_id}"
            with envd_errors(sandbox_id, what, timeout_is_task=True):
                handle = await sbx.sdk.commands.run(
                    line, background=True, stdin=forward, envs=envs or None, cwd=cwd,
                    user=user, timeout=timeout_s, on_stdout=_writer(sys.stdout),
                    on_stderr=_writer(sys.stderr), retain_output=False)
            try:
                async with anyio.create_task_group() as tg:
                    if forward:
                        tg.start_soon(_forward_stdin, handle, sandbox_id)
                    code = await _wait(handle, what, sandbox_id)
                    tg.cancel_scope.cancel()  # the command ended: stop reading our stdin
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await handle.kill()  # Ctrl-C, a timeout, a failure: do not leave it
                raise
            return code

    code = run(flow)
    raise typer.Exit(code)


async def _wait(handle: AsyncCommandHandle[Any], what: str, sandbox_id: str) -> int:
    try:
        with envd_errors(sandbox_id, what, timeout_is_task=True):
            done = await handle.wait()
        return exit_code(done.exit_code, done.error)
    except CommandExitException as exc:
        return exit_code(exc.exit_code, exc.error)
    except SandboxTimeout:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await handle.kill()
        err.print(Text(f"error: {what}: the command ran past --timeout and was ended",
                       style="red"), soft_wrap=True)
        return TIMED_OUT


def _writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()
    return write


async def _forward_stdin(handle: AsyncCommandHandle[Any], sandbox_id: str) -> None:
    """Our stdin to the command's, chunk by chunk in order, then EOF.

    A write that fails is dropped: the command has ended (its stdin is gone with it) or the
    sandbox is lost, which waiting for the command reports."""
    fd = sys.stdin.fileno()
    with contextlib.suppress(ClientError):
        while True:
            # A thread, not the event loop's reader: stdin may be a regular file (epoll
            # refuses those); abandoned when the command ends first (``yes | … head -1``).
            chunk = await anyio.to_thread.run_sync(os.read, fd, STDIN_CHUNK,
                                                   abandon_on_cancel=True)
            with envd_errors(sandbox_id, f"stdin of exec in {sandbox_id}"):
                if not chunk:
                    await handle.close_stdin()
                    return
                await handle.send_stdin(chunk)
