"""``aenv scheduler`` and ``aenv gateway`` as the real commands, each its own process."""

from __future__ import annotations

import contextlib
import http.client
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.cli_run import AENV
from tests.conftest import free_port

START_TIMEOUT_S = 30.0


@dataclass
class Service:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _healthy(port: int) -> bool:
    with contextlib.suppress(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    return False


@contextlib.contextmanager
def service(*args: str, env: dict[str, str] | None = None) -> Iterator[Service]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="aenv-svc-") as root:
        log_path = Path(root) / "service.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [str(AENV), *args, "--listen", f"127.0.0.1:{port}"], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        svc = Service(port, process, log_path)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _healthy(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{args[0]} did not start:\n{svc.log()}")
                time.sleep(0.1)
            yield svc
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
