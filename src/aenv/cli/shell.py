"""``aenv start TEMPLATE`` and ``aenv connect ID``: an interactive shell in a sandbox.

The shell is ``bash -i -l`` on a PTY in the sandbox (the e2b SDK's ``pty`` API: create,
send_stdin, resize, connect), attached to this terminal in raw mode:

* keys go to the sandbox as typed, in order (one sender task), Ctrl-C included;
* a resize of this terminal (SIGWINCH) resizes the PTY;
* **Ctrl-]** detaches: the sandbox and the shell in it keep running, and ``aenv connect ID``
  attaches to that same shell again (the newest detached one; ``--new`` for another);
* the shell's end (``exit``, Ctrl-D) ends the session with the shell's exit code. After
  ``aenv start`` the sandbox is then killed, unless ``--keep``; after ``aenv connect`` it is
  left as it was (it existed before the command);
* while attached the sandbox's timeout is topped up (:data:`LEASE_S`), so a long session is
  not cut; after a detach it lives out what is left (``aenv timeout ID S`` to change it).

Must not touch the sandbox beyond the PTY: no files, no other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from e2b import AsyncCommandHandle, CommandExitException

from aenv.cli import terminal
from aenv.cli.common import CREATE_DEADLINE_S, Metadata, client, err, examples, fail, pairs, run
from aenv.client import AsyncClient, Sandbox
from aenv.client.sandbox import envd_errors

#: Marks the shells this CLI starts (envd lists each process's environment), to find a
#: detached one again.
SHELL_MARK = "AENV_CLI_SHELL"
#: While attached the sandbox always has at least this long to live, checked every
#: :data:`LEASE_CHECK_S`: a person's session must not end because the sandbox timed out.
LEASE_S = 300
LEASE_CHECK_S = 30.0
#: The lifetime ``aenv start`` gives a new sandbox: what is left of it after a detach.
START_TIMEOUT_S = 3600
#: How long a detach waits for the keys typed before it to reach the shell.
FLUSH_S = 5.0


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "aenv start base", "aenv start base --keep -m owner=me",
        "aenv start my-template --timeout 7200",
        "(inside: Ctrl-] detaches and keeps the sandbox; exit ends it)",
    ))(start)
    app.command(epilog=examples(
        "aenv connect i4c2…", "aenv connect --new i4c2…",
        "(inside: Ctrl-] detaches; exit ends the shell, not the sandbox)",
    ))(connect)


def start(
    template: Annotated[str, typer.Argument(help="a template (or snapshot) name or id",
                                            show_default=False)],
    keep: Annotated[bool, typer.Option(
        "--keep", help="keep the sandbox when the shell exits")] = False,
    timeout_s: Annotated[int, typer.Option(
        "--timeout", min=1, help="seconds the sandbox lives (topped up while attached)")
    ] = START_TIMEOUT_S,
    metadata: Metadata = None,
) -> None:
    """Create a sandbox and attach an interactive shell to it (Ctrl-] detaches)."""
    labels = pairs(metadata, "--metadata")
    _need_terminal()

    async def flow() -> int:
        async with client(deadline_s=CREATE_DEADLINE_S) as c:
            with err.status(f"starting a sandbox from {template}"):
                sbx = await c.create(template, timeout=timeout_s, metadata=labels or None)
            try:
                code = await _session(c, sbx, reattach=False)
            except BaseException:
                if not keep:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(c.kill(sbx.sandbox_id))
                raise
            if code is None:
                return 0
            if keep:
                err.print(f"shell exited; sandbox {sbx.sandbox_id} kept")
            else:
                await c.kill(sbx.sandbox_id)
            return code

    raise typer.Exit(run(flow))


def connect(
    sandbox_id: Annotated[str, typer.Argument(help="the sandbox's id", show_default=False)],
    new: Annotated[bool, typer.Option(
        "--new", help="a new shell, even if a detached one is running")] = False,
) -> None:
    """Attach a shell to a running (or paused: resumed) sandbox; Ctrl-] detaches."""
    _need_terminal()

    async def flow() -> int:
        async with client() as c:
            with err.status(f"connecting to {sandbox_id}"):
                sbx = await c.connect(sandbox_id)
            code = await _session(c, sbx, reattach=not new)
            return 0 if code is None else code

    raise typer.Exit(run(flow))


def _need_terminal() -> None:
    if not (os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())):
        fail("an interactive shell needs a terminal (use aenv exec ID -- CMD in scripts)")


async def _session(c: AsyncClient, sbx: Sandbox, *, reattach: bool) -> int | None:
    """Attach this terminal to a shell in ``sbx`` until it exits (its exit code) or the
    detach key (None)."""
    fd_in, out = sys.stdin.fileno(), sys.stdout.buffer
    sid = sbx.sandbox_id
    loop = asyncio.get_running_loop()

    def show(data: bytes) -> None:
        out.write(data)
        out.flush()

    with envd_errors(sid, f"shell in {sid}"):
        handle = await _shell(sbx, show, terminal.size(fd_in), reattach=reattach)
    err.print(f"sandbox {sid}: {terminal.DETACH_NAME} detaches", highlight=False)
    keys: asyncio.Queue[bytes] = asyncio.Queue()
    detached = asyncio.Event()
    resized = asyncio.Event()

    def readable() -> None:
        try:
            data = os.read(fd_in, 4096)
        except OSError:
            data = b""
        data, detach = terminal.split_detach(data)
        if data:
            keys.put_nowait(data)
        if detach or not data:
            detached.set()  # the key, or our terminal went away (EOF)

    async def send() -> None:
        while True:
            data = await keys.get()
            with envd_errors(sid, f"input to the shell in {sid}"):
                await sbx.sdk.pty.send_stdin(handle.pid, data)
            keys.task_done()

    async def resize() -> None:
        while True:
            await resized.wait()
            resized.clear()
            with envd_errors(sid, f"resize the shell in {sid}"):
                await sbx.sdk.pty.resize(handle.pid, terminal.size(fd_in))

    async def ended() -> int:
        try:
            with envd_errors(sid, f"shell in {sid}"):
                done = await handle.wait()
            return int(done.exit_code)
        except CommandExitException as exc:
            return int(exc.exit_code) if exc.exit_code >= 0 else 255

    tasks: list[asyncio.Task[Any]] = []
    with terminal.raw(fd_in):
        loop.add_reader(fd_in, readable)
        loop.add_signal_handler(signal.SIGWINCH, resized.set)
        try:
            if reattach:
                resized.set()  # the shell may have another size from the last terminal
            tasks = [asyncio.create_task(t) for t in (send(), resize(), _lease(c, sid))]
            shell = asyncio.create_task(ended())
            detach = asyncio.create_task(detached.wait())
            tasks += [shell, detach]
            await asyncio.wait([shell, detach, *tasks[:3]],
                               return_when=asyncio.FIRST_COMPLETED)
            for task in tasks[:3]:  # a failed sender, resizer or lease: the session is over
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if detach.done() and not shell.done():
                # What was typed before the key goes to the shell first (it often comes in
                # the same read as the key: "MARK=1\r^]").
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FLUSH_S):
                        await keys.join()
            code = shell.result() if shell.done() else None
        finally:
            loop.remove_reader(fd_in)
            loop.remove_signal_handler(signal.SIGWINCH)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if code is None:
        with contextlib.suppress(Exception):
            await handle.disconnect()  # the shell runs on; ``aenv connect`` finds it
        err.print(f"\ndetached from {sid}; the shell runs on (aenv connect {sid})")
    return code


async def _shell(sbx: Sandbox, show: Any, size: Any, *, reattach: bool
                 ) -> AsyncCommandHandle[Any]:
    """A detached shell of ours (newest first) when ``reattach``, else a new one."""
    if reattach:
        ours = [p for p in await sbx.sdk.commands.list() if p.envs.get(SHELL_MARK) == "1"]
        for process in sorted(ours, key=lambda p: p.pid, reverse=True):
            with contextlib.suppress(Exception):  # it may end while we look
                handle = await sbx.sdk.pty.connect(process.pid, show, timeout=0)
                err.print(f"attached to shell {process.pid} (Enter for a prompt)")
                return handle
    return await sbx.sdk.pty.create(size, show, envs={SHELL_MARK: "1"}, timeout=0)


async def _lease(c: AsyncClient, sandbox_id: str) -> None:
    """Keep at least :data:`LEASE_S` of life in the sandbox while attached (never shorten)."""
    while True:
        info = await c.info(sandbox_id)
        if info.end_at:
            left = (datetime.fromisoformat(info.end_at) - datetime.now(UTC)).total_seconds()
            if left < LEASE_S:
                await c.set_timeout(sandbox_id, LEASE_S)
        await asyncio.sleep(LEASE_CHECK_S)
