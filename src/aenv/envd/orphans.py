"""Reaping orphans: envd is the sandbox's init, and init waits for what is left to it.

A process whose parent exits is handed to PID 1. Unless PID 1 waits for it, it stays a zombie
for the sandbox's life, and zombies count against ``RLIMIT_NPROC``: after a fork bomb as
``user`` was killed, its ~500 zombies made every later fork of that user fail with EAGAIN.
A daemon's parent, a ``nohup cmd &`` whose shell ended, a killed pipeline: the same, a zombie
at a time.

``watch`` has the event loop call ``reap`` at most every ``DELAY_S`` after a ``SIGCHLD``
(during a bomb thousands arrive; one scan of ``/proc`` takes them all). Only zombies that no
one else will wait for are taken: envd's own children are waited for by whoever started them
(the process manager needs their exit statuses), so a zombie child of envd is reaped here
only when it is **in a session that is neither its own nor envd's** — a command's descendant
(every command envd starts leads a session of its own, ``start_new_session``).

Owns: the ``SIGCHLD`` handler of envd's loop. Must not touch: the process manager's
processes (session leaders) and children envd started in its own session (helpers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

log = logging.getLogger("envd.orphans")

#: How long after a ``SIGCHLD`` the scan runs: later ones meanwhile are covered by it.
DELAY_S = 0.5


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` fields after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def reap() -> int:
    """Wait for every zombie child of this process that is an orphan of a command; how many."""
    me = os.getpid()
    own_session = os.getsid(0)
    reaped = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        fields = _stat(pid)
        if fields is None or len(fields) < 4 or fields[0] != b"Z" or int(fields[1]) != me:
            continue
        session = int(fields[3])
        if session in (pid, own_session):
            continue  # a session leader envd started, or a helper: its starter waits for it
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
    return reaped


def watch(loop: asyncio.AbstractEventLoop) -> None:
    """Reap orphans ``DELAY_S`` after each ``SIGCHLD`` (one scan for a burst)."""
    pending: list[asyncio.TimerHandle] = []

    def scan() -> None:
        pending.clear()
        try:
            count = reap()
        except OSError as exc:
            log.warning("reaping orphans failed: %s", exc)
            return
        if count:
            log.info("reaped %d orphaned processes", count)

    def on_sigchld() -> None:
        if not pending:
            pending.append(loop.call_later(DELAY_S, scan))

    loop.add_signal_handler(signal.SIGCHLD, on_sigchld)
