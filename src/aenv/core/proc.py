"""The one place where aenv runs external commands.

``run`` takes an argv list (never a shell string), captures output, enforces a timeout, and on
timeout or cancellation terminates the child (SIGTERM, a grace period, then SIGKILL) and reaps it
before returning, so no zombie and no orphan survives a cancelled caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aenv.core.errors import CommandError, CommandTimeout

#: How long a child gets between SIGTERM and SIGKILL when we give up on it.
TERMINATE_GRACE_S = 2.0


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
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise CommandError(args, None, str(exc)) from exc
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input)
    except TimeoutError as exc:
        await asyncio.shield(_terminate(proc))
        raise CommandTimeout(args, None, f"timed out after {timeout}s") from exc
    except BaseException:
        await asyncio.shield(_terminate(proc))
        raise
    assert proc.returncode is not None
    done = Completed(args, proc.returncode, out, err)
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, err.decode("utf-8", "replace"))
    return done


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
