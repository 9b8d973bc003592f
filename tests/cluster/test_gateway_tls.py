"""``aenv gateway`` over HTTPS (its ``tls_cert_file`` and ``tls_key_file``), the real command:
it answers with the operator's certificate, which a client checks against its CA; a client
without that CA refuses it. Only ``/health`` is asked: no Redis or scheduler is needed."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.certs import issue
from tests.cluster.services import AENV
from tests.conftest import free_port


def test_the_gateway_serves_https_with_its_certificate(tmp_path: Path) -> None:
    cert, key, ca = issue(tmp_path, ["gateway.aenv.test", "*.aenv.test"], ["127.0.0.1"])
    port = free_port()
    env = {**os.environ, "AENV_TLS_CERT_FILE": str(cert), "AENV_TLS_KEY_FILE": str(key)}
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(AENV), "gateway", "--cluster", "redis://127.0.0.1:1/0",
             "--listen", f"127.0.0.1:{port}"], env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        trusting = ssl.create_default_context(cafile=str(ca))
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(f"https://127.0.0.1:{port}/health", verify=trusting)
                break
            except httpx.ConnectError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        assert answer.status_code == 200
        with pytest.raises(httpx.ConnectError):  # a client without the CA: real TLS
            httpx.get(f"https://127.0.0.1:{port}/health")
        with pytest.raises(httpx.RemoteProtocolError):  # no plain HTTP beside it
            httpx.get(f"http://127.0.0.1:{port}/health")
    finally:
        process.terminate()
        process.wait(10)
