"""A pids limit inside the sandbox, and a fork-bomb killer at it (envd ``--pids-limit``).

Off by default (``runtime/oci.Limits.guest_pids``): measured, it saved the sandbox from a
bash fork bomb only about half the time on runsc 20240729 (docs/lifecycle.md, "When a sandbox
dies"), and the limit it needs is too low for many workloads.

``setup`` mounts gVisor's own cgroupfs (pids controller; it lives in the sentry, not on the
host) at ``MOUNT``, makes one cgroup ``user`` with ``pids.max`` = the limit, and every process
envd starts for the user (commands, PTYs, the sudo stand-in's commands) is born inside it
(``spawning``). envd itself stays in the root cgroup, so it can always start threads and
answer. A fork inside ``user`` beyond the limit fails with EAGAIN, as under a VM's kernel,
root included (RLIMIT_NPROC does not bind root).

EAGAIN alone does not save the sandbox: the runtime's host tasks grow with the guest's churn
of address spaces and the sentry's threads, not with its live processes (ptrace platform:
~12-15 host tasks per guest process during a bash fork bomb, kept after the guest process
exits; systrap: several stub processes per guest process), so a bomb held at a guest limit of
50 tasks still reached the host limit within seconds. So the watcher thread treats a full
``user`` that is mostly processes (``PROCESSES_PER_LIMIT``; a JVM's threads only meet
EAGAIN) as a fork bomb: with ``pids.max`` at 0 so that nothing refills it, it SIGKILLs every
process of the sandbox but envd (``kill(-1)``, one system call: a bomb starves envd, and
killing ~130 processes one by one took 3-5 s), then reaps the orphans. The limit must stay
low: every task at it competes with envd for the CPUs (at 1,024 the watcher never got to
run). It looks every ``SLOW_S`` while ``user`` is below half its limit, every ``FAST_S``
above.

Owns: the mount and the ``user`` cgroup. Must not touch: envd's own children's exit
statuses (the process manager reaps those).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

from aenv.envd import orphans

log = logging.getLogger("envd.pidlimit")

#: Where the sandbox's own cgroupfs goes: envd's tmpfs /dev, never the user's disk.
MOUNT = "/dev/.aenv-pids"
#: The cgroup user processes run in.
USER = f"{MOUNT}/user"
SLOW_S = 0.25
FAST_S = 0.02
#: How long a kill round waits at most for the user's cgroup to empty.
KILL_ROUND_S = 10.0
#: At its limit, ``user`` is a fork bomb if at least ``limit // PROCESSES_PER_LIMIT`` of its
#: tasks are processes: a few processes with many threads (a JVM) meet EAGAIN as under a VM
#: and nothing is killed for them.
PROCESSES_PER_LIMIT = 2

_enabled = False


def setup(limit: int) -> bool:
    """Mount the pids controller, make ``user`` with ``pids.max = limit`` and start the
    watcher; False (and no limit) where that is not possible (not gVisor, not root)."""
    global _enabled
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        os.makedirs(MOUNT, exist_ok=True)
        if not os.path.ismount(MOUNT) and libc.mount(b"none", MOUNT.encode(), b"cgroup", 0,
                                                      b"pids") != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        os.makedirs(USER, exist_ok=True)
        _write(f"{USER}/pids.max", str(limit))
    except OSError as exc:
        log.warning("no pids limit in this sandbox: %s", exc)
        return False
    _enabled = True
    threading.Thread(target=_watch, args=(limit,), name="pids-watch", daemon=True).start()
    return True


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Inside: processes this thread starts are born in the limited cgroup.

    The calling thread (only it: ``tasks``, not ``cgroup.procs``) joins ``user`` for the
    ``fork``/``exec`` and leaves again; a child inherits its parent thread's cgroups, so it
    is limited before it runs a single instruction of its own. (Moving the child after
    ``Popen`` returned raced with it: bash had exec'd or forked before the move about one
    time in eight, and a bomb forked that early is not limited at all.) A fork while ``user``
    is at its limit fails with EAGAIN, as any fork in it would.
    """
    if not _enabled:
        yield
        return
    tid = str(threading.get_native_id())
    try:
        _write(f"{USER}/tasks", tid)
    except OSError as exc:
        log.warning("cannot start a process in the pids cgroup: %s", exc)
        yield
        return
    try:
        yield
    finally:
        _write(f"{MOUNT}/tasks", tid)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(name: str) -> str:
    with open(f"{USER}/{name}") as f:
        return f.read()


def _watch(limit: int) -> None:
    bomb_at = max(1, limit // PROCESSES_PER_LIMIT)
    while True:
        try:
            current = int(_read("pids.current"))
            # Tasks first (one cheap read); processes only once the limit is reached.
            if current >= limit and len(_read("cgroup.procs").split()) >= bomb_at:
                _kill_all(limit)
        except (OSError, ValueError) as exc:
            log.warning("the pids watch stopped: %s", exc)
            return
        time.sleep(FAST_S if current * 2 >= limit else SLOW_S)


def _kill_all(limit: int) -> None:
    """SIGKILL every process but envd: ``kill(-1)`` first, one system call (on a sandbox a
    bomb starves, each call of envd's takes tens of milliseconds: killing ~130 processes one
    by one took 3-5 s, and the host limit came first), then whatever is left in ``user``
    until it is empty. With ``pids.max`` at 0 meanwhile no fork there succeeds, so nothing
    refills it."""
    started = time.monotonic()
    _write(f"{USER}/pids.max", "0")
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # as PID 1: everything in the sandbox but envd
        while time.monotonic() - started < KILL_ROUND_S:
            pids = [int(p) for p in _read("cgroup.procs").split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(FAST_S)
    finally:
        _write(f"{USER}/pids.max", str(limit))
    reaped = orphans.reap()
    log.warning("the sandbox's processes reached their limit of %d tasks (a fork bomb?): "
                "killed them all in %.2f s, reaped %d", limit, time.monotonic() - started, reaped)
