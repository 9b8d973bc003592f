"""The one place where aenv runs external commands.

``run`` takes an argv list (never a shell string), captures output, enforces a timeout, and on
timeout or cancellation terminates the child (SIGTERM, a grace period, then SIGKILL) and reaps it
before returning, so no zombie and no orphan survives a cancelled caller. ``run_lines`` is the
same with each output line handed to a callback as it arrives (progress of long commands).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from aenv.core.errors import CommandError, CommandTimeout

#: Pids of the children ``run`` and ``run_lines`` started and have not reaped yet: asyncio
#: waits for these, so a reaper of adopted processes must leave them alone (``spawned``).
_SPAWNED: set[int] = set()

#: How long a child gets between SIGTERM and SIGKILL when we give up on it.
TERMINATE_GRACE_S = 2.0

#: ``run_lines`` hands over a line without its newline once it grows this long, so a child that
#: never writes one cannot make us buffer without bound.
MAX_LINE_BYTES = 64 * 1024

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True)
class Completed:
    argv: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


async def run(
    argv: Sequence[str],
    *,
    timeout: float | None = 60.0,
    check: bool = True,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Completed:
    """Run ``argv`` to completion and return its output.

    Raises :class:`CommandError` when the command exits non-zero (``check``) or cannot be
    started, :class:`CommandTimeout` when it outlives ``timeout`` seconds.
    """
    args = [os.fspath(a) for a in argv]
    proc = await _spawn(args, with_input=input is not None, env=env, cwd=cwd)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input)
    except TimeoutError as exc:
        await asyncio.shield(_terminate(proc))
        raise CommandTimeout(args, None, f"timed out after {timeout}s") from exc
    except BaseException:
        await asyncio.shield(_terminate(proc))
        raise
    finally:
        _SPAWNED.discard(proc.pid)
    assert proc.returncode is not None
    done = Completed(args, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, err.decode("utf-8", "replace"))
    return done


async def run_lines(
    argv: Sequence[str],
    *,
    on_line: Callable[[Stream, str], None],
    timeout: float | None = 60.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Completed:
    """Run ``argv`` to completion, calling ``on_line(stream, line)`` for each line it writes.

    Lines are decoded as UTF-8 (invalid bytes replaced) and handed over without their line end,
    in order within each stream, as soon as they are complete (a last line without a newline
    comes at the end). ``on_line`` runs on the event loop: it must be quick. The returned
    :class:`Completed` still holds all of stdout and stderr. stdin is ``/dev/null``.

    Same guarantees as :func:`run`: :class:`CommandError` on a non-zero exit (``check``) or a
    failed start, :class:`CommandTimeout` after ``timeout`` seconds; on timeout, cancellation or
    an exception from ``on_line`` (re-raised as is) the child's process group is terminated and
    reaped before this returns.
    """
    args = [os.fspath(a) for a in argv]
    proc = await _spawn(args, with_input=False, env=env, cwd=cwd)
    assert proc.stdout is not None and proc.stderr is not None
    out = bytearray()
    err = bytearray()
    pumps = [
        asyncio.ensure_future(_pump(proc.stdout, "stdout", out, on_line)),
        asyncio.ensure_future(_pump(proc.stderr, "stderr", err, on_line)),
    ]
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(*pumps)
            await proc.wait()
    except TimeoutError as exc:
        await asyncio.shield(_terminate(proc))
        raise CommandTimeout(args, None, f"timed out after {timeout}s") from exc
    except BaseException:
        await asyncio.shield(_terminate(proc))
        raise
    finally:
        # gather leaves the other pump running when one fails: stop it, and collect both.
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        _SPAWNED.discard(proc.pid)
    assert proc.returncode is not None
    done = Completed(args, proc.returncode, bytes(out), bytes(err))
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, done.stderr.decode("utf-8", "replace"))
    return done


async def _pump(
    reader: asyncio.StreamReader,
    stream: Stream,
    sink: bytearray,
    on_line: Callable[[Stream, str], None],
) -> None:
    pending = b""
    while chunk := await reader.read(65536):
        sink += chunk
        pending += chunk
        *lines, pending = pending.split(b"\n")
        while len(pending) >= MAX_LINE_BYTES:
            lines.append(pending[:MAX_LINE_BYTES])
            pending = pending[MAX_LINE_BYTES:]
        for line in lines:
            on_line(stream, line.removesuffix(b"\r").decode("utf-8", "replace"))
    if pending:
        on_line(stream, pending.removesuffix(b"\r").decode("utf-8", "replace"))


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(TERMINATE_GRACE_S):
            await proc.wait()
            return
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


async def _spawn(
    args: list[str],
    *,
    with_input: bool,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
) -> asyncio.subprocess.Process:
    """Start ``args`` in a session of its own with piped output; ``CommandError`` if it
    cannot be started at all."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if with_input else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise CommandError(args, None, str(exc)) from exc
    _SPAWNED.add(proc.pid)
    return proc


def watch_children_by_pidfd() -> bool:
    """Have asyncio learn of its children's exits from a pidfd each (Linux 5.3+) instead of
    a thread each: Python 3.11's default watcher starts a thread per child and waits on the
    event loop until it runs, 15 % of a node's event loop while it made and deleted 16
    sandboxes (a dozen subprocesses each). Python 3.12 chooses pidfds itself. Call before the
    loop starts; False where pidfds are missing (the default watcher stays)."""
    if sys.version_info >= (3, 12) or not hasattr(asyncio, "PidfdChildWatcher"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


def spawned() -> frozenset[int]:
    """Pids of the children started here that are still to be reaped (by asyncio)."""
    return frozenset(_SPAWNED)
