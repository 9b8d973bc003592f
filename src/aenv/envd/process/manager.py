"""The table of processes envd started, and each one's output fan-out.

A process belongs to envd, not to the HTTP stream that started it: when a stream disconnects the
process keeps running and can be re-attached with ``Connect``. Output read while nobody is
attached is dropped, as in E2B's envd. Finished processes stay visible to ``Connect`` for a while
so a late re-attach still gets the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aenv.core.errors import FailedPrecondition, InvalidArgument, NotFound
from aenv.envd import pidlimit
from aenv.envd.process.console_tee import START_TAG, ConsoleTee
from aenv.envd.process.exitstatus import ExitInfo
from aenv.envd.process.shell import shell_argv
from aenv.envd.process.spawn import Spawned, set_winsize, spawn
from aenv.envd.users import User

log = logging.getLogger("aenv.envd.process")

#: Bytes read from a pipe or PTY per wake-up.
READ_CHUNK = 64 * 1024
#: How long a finished process can still be re-attached to, and how many are remembered.
FINISHED_RETENTION_S = 600.0
FINISHED_MAX = 1000

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ProcessConfig:
    cmd: str
    args: tuple[str, ...]
    envs: Mapping[str, str]
    cwd: str


@dataclass(frozen=True)
class Output:
    stream: str  # "stdout" | "stderr" | "pty"
    data: bytes


Event = Output | ExitInfo


@dataclass(eq=False)
class ManagedProcess:
    pid: int
    config: ProcessConfig
    tag: str | None
    spawned: Spawned
    exit: ExitInfo | None = None
    subscribers: set[asyncio.Queue[Event]] = field(default_factory=set)
    finished_at: float | None = None
    _open_outputs: set[str] = field(default_factory=set)
    _input_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _reaped: int | None = None
    #: The start command's: its output copied to the console (``console_tee.py``).
    console: ConsoleTee | None = None

    @property
    def is_pty(self) -> bool:
        return self.spawned.pty_master is not None

    @property
    def running(self) -> bool:
        return self.exit is None

    def subscribe(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        if self.exit is not None:
            queue.put_nowait(self.exit)
        else:
            self.subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        self.subscribers.discard(queue)

    def _publish(self, event: Event) -> None:
        for queue in self.subscribers:
            queue.put_nowait(event)

    async def write_input(self, data: bytes, *, pty: bool) -> None:
        if self.exit is not None:
            raise NotFound(f"process with pid {self.pid} not found")
        if pty and not self.is_pty:
            raise InvalidArgument(f"process {self.pid} has no pty")
        if not pty and self.is_pty:
            raise InvalidArgument(f"process {self.pid} is a pty process: send pty input")
        fd = self.spawned.input_fd
        if fd is None:
            raise FailedPrecondition(f"stdin of process {self.pid} is closed")
        async with self._input_lock:
            await _write_all(fd, data)

    def close_stdin(self) -> None:
        if self.is_pty:
            raise FailedPrecondition("cannot close stdin of a pty process; send Ctrl+D instead")
        fd = self.spawned.input_fd
        if fd is not None:
            self.spawned.input_fd = None
            os.close(fd)

    def resize(self, cols: int, rows: int) -> None:
        master = self.spawned.pty_master
        if master is None:
            raise InvalidArgument(f"process {self.pid} has no pty")
        if self.exit is None:
            set_winsize(master, cols, rows)

    def send_signal(self, signum: int) -> None:
        if self.exit is not None:
            raise NotFound(f"process with pid {self.pid} not found")
        # The whole session: `bash -c` children die with their shell.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _write_all(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
            view = view[written:]
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _resolve, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EIO, errno.EBADF):
                raise FailedPrecondition("process no longer reads its input") from None
            raise


class ProcessManager:
    def __init__(self, exec_helper: str | None = None) -> None:
        self.exec_helper = exec_helper
        self._running: dict[int, ManagedProcess] = {}
        self._finished: OrderedDict[int, ManagedProcess] = OrderedDict()

    def list_running(self) -> list[ManagedProcess]:
        return list(self._running.values())

    def find(self, *, pid: int | None = None, tag: str | None = None) -> ManagedProcess:
        """A running (or recently finished) process by pid or tag."""
        self._expire_finished()
        if pid is not None:
            found = self._running.get(pid) or self._finished.get(pid)
            if found is not None:
                return found
            raise NotFound(f"process with pid {pid} not found")
        if tag:
            for proc in list(self._running.values()) + list(reversed(self._finished.values())):
                if proc.tag == tag:
                    return proc
            raise NotFound(f"process with tag {tag} not found")
        raise InvalidArgument("a process selector (pid or tag) is required")

    def find_running(self, *, pid: int | None = None, tag: str | None = None) -> ManagedProcess:
        proc = self.find(pid=pid, tag=tag)
        if not proc.running:
            raise NotFound(f"process with pid {proc.pid} not found")
        return proc

    def start(
        self,
        argv: Sequence[str],
        *,
        config: ProcessConfig,
        env: Mapping[str, str],
        user: User,
        tag: str | None,
        pty_size: tuple[int, int] | None,
        stdin: bool,
    ) -> ManagedProcess:
        if not os.path.isdir(config.cwd):
            raise InvalidArgument(f"cwd '{config.cwd}' does not exist or is not a directory")
        try:
            with pidlimit.spawning():
                spawned = spawn(
                    shell_argv(argv), env=env, cwd=config.cwd, user=user, pty_size=pty_size,
                    stdin=stdin, exec_helper=self.exec_helper,
                )
        except FileNotFoundError as exc:
            raise InvalidArgument(f"failed to start {config.cmd!r}: {exc.strerror}") from None
        except PermissionError as exc:
            raise InvalidArgument(f"failed to start {config.cmd!r}: {exc.strerror}") from None
        proc = ManagedProcess(spawned.popen.pid, config, tag, spawned,
                              console=ConsoleTee() if tag == START_TAG else None)
        self._running[proc.pid] = proc
        self._watch(proc)
        return proc

    # -- output and exit plumbing -------------------------------------------------------------

    def _watch(self, proc: ManagedProcess) -> None:
        loop = asyncio.get_running_loop()
        for stream, fd in proc.spawned.outputs.items():
            proc._open_outputs.add(stream)
            loop.add_reader(fd, self._on_readable, proc, stream, fd)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = None
        if pidfd is not None:
            loop.add_reader(pidfd, self._on_pidfd, proc, pidfd)
        else:  # kernels (or gVisor builds) without pidfd: a waiter thread per process
            def wait_in_thread() -> None:
                code = proc.spawned.popen.wait()
                loop.call_soon_threadsafe(self._on_reaped, proc, code)

            threading.Thread(target=wait_in_thread, daemon=True, name=f"wait-{proc.pid}").start()

    def _on_readable(self, proc: ManagedProcess, stream: str, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EIO:  # EIO: the PTY's last slave closed
                log.warning("reading %s of pid %d: %s", stream, proc.pid, exc)
            data = b""
        if data:
            proc._publish(Output(stream, data))
            if proc.console is not None:
                proc.console.write(stream, data)
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(fd)
        proc._open_outputs.discard(stream)
        if stream != "pty":
            os.close(fd)
        self._maybe_finish(proc)

    def _on_pidfd(self, proc: ManagedProcess, pidfd: int) -> None:
        returncode = proc.spawned.popen.poll()
        if returncode is None:
            return  # a spurious wake-up (a restored epoll, eventloop.py): never block the loop
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        self._on_reaped(proc, returncode)

    def _on_reaped(self, proc: ManagedProcess, returncode: int) -> None:
        proc._reaped = returncode
        if proc.is_pty:
            # Whatever is still buffered in the PTY was written before the exit; drain it, then
            # stop: background children keeping the terminal open must not hold the command.
            master = proc.spawned.pty_master
            assert master is not None
            if "pty" in proc._open_outputs:
                while True:
                    try:
                        data = os.read(master, READ_CHUNK)
                    except OSError:
                        break
                    if not data:
                        break
                    proc._publish(Output("pty", data))
                asyncio.get_running_loop().remove_reader(master)
                proc._open_outputs.discard("pty")
        self._maybe_finish(proc)

    def _maybe_finish(self, proc: ManagedProcess) -> None:
        if proc._reaped is None or proc._open_outputs or proc.exit is not None:
            return
        proc.exit = ExitInfo.from_returncode(proc._reaped)
        proc.finished_at = time.monotonic()
        if proc.console is not None:
            proc.console.close()
        for fd in {proc.spawned.input_fd, proc.spawned.pty_master} - {None}:
            with contextlib.suppress(OSError):
                os.close(fd)  # type: ignore[arg-type]
        proc.spawned.input_fd = None
        proc._publish(proc.exit)
        proc.subscribers.clear()
        self._running.pop(proc.pid, None)
        self._finished[proc.pid] = proc
        self._expire_finished()

    def _expire_finished(self) -> None:
        now = time.monotonic()
        while self._finished:
            pid, oldest = next(iter(self._finished.items()))
            age = now - (oldest.finished_at or now)
            too_old = age > FINISHED_RETENTION_S
            if len(self._finished) > FINISHED_MAX or too_old:
                self._finished.pop(pid)
            else:
                break

    def kill_all(self) -> None:
        for proc in list(self._running.values()):
            with contextlib.suppress(Exception):
                proc.send_signal(signal.SIGKILL)
