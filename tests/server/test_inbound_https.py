"""Sandbox hostnames over HTTPS as E2B serves them (``https://{port}-{id}.{domain}``): the
node's HTTPS listener (``tls_listen``) with a wildcard certificate for ``*.aenv.test``, and
E2B's own SDK inbound tests (``test_allow_public_traffic_false``, ``…_true``,
``test_mask_request_host`` of its ``test_network.py``) case by case through the SDK's
``get_host``.

A deployment points ``*.<domain>`` at the node with a DNS record (docs/deployment.md, "HTTPS
hostnames"); here the test process resolves ``*.aenv.test`` itself, to the node's HTTPS
listener (a stand-in for that record and for port 443): nothing else is faked, the TLS is
the node's and the client checks it against the test CA.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox, SandboxNetworkOpts

from tests.certs import issue
from tests.conftest import free_port
from tests.server.harness import NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(300)]

DOMAIN = "aenv.test"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return issue(tmp_path_factory.mktemp("tls"), [f"*.{DOMAIN}", DOMAIN])


@pytest.fixture(scope="module")
def node(tls: tuple[Path, Path, Path]) -> Iterator[NodeServer]:
    cert, key, _ = tls
    port = free_port()
    with serving(sandbox_domain=DOMAIN, tls_listen=f"127.0.0.1:{port}",
                 tls_cert_file=str(cert), tls_key_file=str(key)) as server:
        server.tls_port = port  # type: ignore[attr-defined]
        yield server


@pytest.fixture
def resolved(node: NodeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``*.aenv.test:443`` → the node's HTTPS listener, for this process (the DNS record)."""
    real = socket.getaddrinfo
    port = node.tls_port  # type: ignore[attr-defined]

    def getaddrinfo(host: Any, service: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith("." + DOMAIN) and service in (443, "443"):
            return real("127.0.0.1", port, *args, **kwargs)
        return real(host, service, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def client(tls: tuple[Path, Path, Path], resolved: None) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(tls[2]))) as made:
        yield made


@pytest.fixture
def sandbox_factory(node: NodeServer) -> Iterator[Any]:
    made: list[Sandbox] = []

    def factory(**options: Any) -> Sandbox:
        sbx = Sandbox.create(timeout=options.pop("timeout", 120), **options)
        made.append(sbx)
        return sbx

    yield factory
    for sbx in made:
        sbx.kill()


def _wait_for_status(client: httpx.Client, url: str, status: int,
                     headers: dict[str, str] | None = None) -> httpx.Response:
    deadline = time.monotonic() + 15
    while True:
        response = client.get(url, headers=headers, follow_redirects=True)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.5)


def test_allow_public_traffic_false(sandbox_factory: Any, client: httpx.Client) -> None:
    sbx = sandbox_factory(secure=True,
                          network=SandboxNetworkOpts(allow_public_traffic=False))
    assert sbx.traffic_access_token is not None
    sbx.commands.run("python3 -m http.server 8080", background=True)
    url = f"https://{sbx.get_host(8080)}"
    assert url.endswith(f".{DOMAIN}")
    headers = {"e2b-traffic-access-token": sbx.traffic_access_token}
    assert _wait_for_status(client, url, 200, headers=headers).status_code == 200
    assert client.get(url, follow_redirects=True).status_code == 403


def test_allow_public_traffic_true(sandbox_factory: Any, client: httpx.Client) -> None:
    sbx = sandbox_factory(network=SandboxNetworkOpts(allow_public_traffic=True))
    sbx.commands.run("python3 -m http.server 8080", background=True)
    url = f"https://{sbx.get_host(8080)}"
    assert _wait_for_status(client, url, 200).status_code == 200


def test_mask_request_host(sandbox_factory: Any, client: httpx.Client) -> None:
    sbx = sandbox_factory(network=SandboxNetworkOpts(
        mask_request_host="custom-host.example.com:${PORT}"), timeout=60)
    output = "/tmp/headers.txt"
    sbx.commands.run(
        f"""python3 -c "
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open('{output}', 'w') as f:
            for k, v in self.headers.items():
                f.write(k + ': ' + v + chr(10))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(('', 8080), H).handle_request()
" """, background=True)
    url = f"https://{sbx.get_host(8080)}"
    _wait_for_status(client, url, 200)
    seen = sbx.commands.run(f"cat {output}").stdout
    assert "Host: custom-host.example.com:8080" in seen, seen


def test_the_certificate_is_checked_and_plain_http_still_serves(
        node: NodeServer, resolved: None, sandbox_factory: Any) -> None:
    """A client without the CA refuses the listener (it is real TLS); the API answers over
    HTTPS too; the HTTP listener is unchanged."""
    sbx = sandbox_factory()
    with httpx.Client() as untrusting, pytest.raises(httpx.ConnectError):
        untrusting.get(f"https://{sbx.get_host(8080)}")
    assert httpx.get(f"{node.url}/health").status_code == 200
