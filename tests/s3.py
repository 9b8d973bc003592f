"""A real S3-compatible server for tests: moto in server mode (``moto_server``) on a free port.

Each server is its own process with its own log file, answers on ``127.0.0.1:<port>`` only, and
keeps its objects in memory: a restart (:meth:`S3Server.restart`) comes back on the same port
with nothing in it (the bucket is created again). :meth:`S3Server.stop` leaves it down, which is
how a test makes the repository unreachable in the middle of an operation. The session fixture
``s3_server`` (``tests/storage/conftest.py``) shares one server; a test that stops its server
starts its own with :func:`run_s3_server`. Tests that share a server keep apart by prefix
(:meth:`S3Server.location`).
"""

from __future__ import annotations

import contextlib
import http.client
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from aenv.storage.objects import S3Location
from tests.conftest import free_port

MOTO_BIN = Path(sys.executable).with_name("moto_server")
BUCKET = "aenv-test"
#: moto imports its whole service catalogue on start: a few seconds on a loaded machine.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: moto takes any credentials; these only have to be present (obstore would look for others).
ACCESS_KEY_ID = "aenv-test-key"
SECRET_ACCESS_KEY = "aenv-test-secret"
REGION = "us-east-1"

needs_moto = pytest.mark.skipif(
    not MOTO_BIN.exists(), reason="needs moto_server (pip install 'moto[server]': dev extras)"
)


@dataclass
class S3Server:
    port: int
    root: Path
    bucket: str = BUCKET
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)
    #: The address it listens on (another than loopback for nodes in network namespaces).
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "moto.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def options(self) -> dict[str, Any]:
        """The S3 connection options, as ``Settings.s3_options()`` gives them."""
        return {
            "endpoint": self.endpoint,
            "region": REGION,
            "access_key_id": ACCESS_KEY_ID,
            "secret_access_key": SECRET_ACCESS_KEY,
            "allow_http": True,
            "virtual_hosted": False,
        }

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def location(self, prefix: str | None = None) -> S3Location:
        """A location in this server's bucket, under ``prefix`` (default: a fresh random one)."""
        prefix = prefix if prefix is not None else f"t-{secrets.token_hex(6)}"
        return S3Location(kind="s3", bucket=self.bucket, prefix=prefix, **self.options())

    # -- process ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (on :attr:`port`), wait until it answers, create the bucket."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by stop)
        self.process = subprocess.Popen(
            [str(MOTO_BIN), "-H", self.host, "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"moto_server exited ({self.process.returncode}):\n{self.log()}"
                )
            with contextlib.suppress(OSError):
                if self._request("PUT", f"/{self.bucket}") == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"moto_server did not answer in {START_TIMEOUT_S}s:\n{self.log()}"
                )
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server (its objects are lost); fails if it ignores SIGTERM."""
        process, self.process = self.process, None
        try:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                    raise AssertionError(f"moto_server :{self.port} ignored SIGTERM") from None
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port: an empty server with the bucket made again."""
        self.stop()
        self.start()

    def _request(self, method: str, path: str) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()


@contextlib.contextmanager
def run_s3_server(host: str = "127.0.0.1") -> Iterator[S3Server]:
    """A running moto server with :data:`BUCKET` created, stopped at the end."""
    if not MOTO_BIN.exists():
        pytest.skip(f"needs {MOTO_BIN} (moto[server], in the dev extras)")
    with tempfile.TemporaryDirectory(prefix="aenv-moto-") as root:
        server = S3Server(port=free_port(), root=Path(root), host=host)
        server.start()
        try:
            yield server
        finally:
            server.stop()
