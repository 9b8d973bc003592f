"""A real Redis server for tests: Debian's ``redis-server`` on a free loopback port.

Each server is its own process with its own directory (no persistence unless a test asks for
an append-only file, which :meth:`RedisServer.restart` then keeps). Stop it with
:meth:`RedisServer.kill` (SIGKILL, as a crash) or :meth:`RedisServer.stop`.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port

REDIS_BIN = shutil.which("redis-server")
START_TIMEOUT_S = 15.0


@dataclass
class RedisServer:
    port: int
    root: Path
    append_only: bool = False
    process: subprocess.Popen[bytes] | None = None
    #: The address it listens on (another than loopback for nodes in network namespaces).
    host: str = "127.0.0.1"
    #: More redis-server options (``--replicaof HOST PORT``, say).
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        assert REDIS_BIN is not None, "redis-server is not installed (make deps installs it)"
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 (the child holds it)
        with log:
            self.process = subprocess.Popen(
                [REDIS_BIN, "--bind", self.host, "--port", str(self.port),
                 "--dir", str(self.root), "--save", "",
                 "--appendonly", "yes" if self.append_only else "no",
                 "--protected-mode", "no", "--daemonize", "no", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._pong():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"redis-server did not start:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        path = self.root / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _pong(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
                (self.host, self.port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
        return False

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()


@contextlib.contextmanager
def run_redis(append_only: bool = False, host: str = "127.0.0.1") -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="aenv-redis-") as root:
        server = RedisServer(free_port(), Path(root), append_only=append_only, host=host)
        server.start()
        try:
            yield server
        finally:
            server.kill()
