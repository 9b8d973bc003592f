"""Escape attempts through the node's API and proxy: each must be refused.

The SDK makes the sandboxes and the URLs; the tampering is done by hand, as an attacker would
(raw HTTP, so nothing normalises the paths on the way)."""

from __future__ import annotations

import hashlib
import http.client
import json
import secrets
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv.envd.signing import sign
from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]

ENVD = "49983"


def request(
    server: NodeServer,
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    """One raw HTTP request: ``target`` goes on the wire exactly as given."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def to_sandbox(sbx: Sandbox, token: str | None = None) -> dict[str, str]:
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": ENVD}
    if token is not None:
        headers["X-Access-Token"] = token
    return headers


def token_of(sbx: Sandbox) -> str:
    token = sbx._envd_access_token
    assert token, "the node gives every sandbox an envd access token"
    return token


def assert_e2b_error(status: int, body: bytes) -> None:
    assert 400 <= status < 500 or status == 502, (status, body[:300])
    error = json.loads(body)
    assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), error


@pytest.fixture
def pair(server: NodeServer) -> Iterator[tuple[Sandbox, Sandbox]]:
    a, b = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def test_another_sandboxs_token_is_refused(
    pair: tuple[Sandbox, Sandbox], server: NodeServer
) -> None:
    a, b = pair
    files = "/files?path=%2Fetc%2Fhostname&username=root"
    rpc = "/process.Process/List"
    rpc_headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    # Control: a's own token works for both.
    assert request(server, "GET", files, headers=to_sandbox(a, token_of(a)))[0] == 200
    status, _ = request(
        server, "POST", rpc, headers={**to_sandbox(a, token_of(a)), **rpc_headers}, body=b"{}"
    )
    assert status == 200
    for token in (token_of(b), None, "", token_of(a)[:-1], token_of(a) + "x"):
        status, _ = request(server, "GET", files, headers=to_sandbox(a, token))
        assert status == 401, token
        status, _ = request(
            server, "POST", rpc, headers={**to_sandbox(a, token), **rpc_headers}, body=b"{}"
        )
        assert status == 401, token


@pytest.mark.parametrize(
    "target",
    [
        "/sandboxes/..%2F..%2Fhealth",
        "/sandboxes/%2e%2e",
        "/sandboxes/..%2fsandboxes",
        "/sandboxes/%2e%2e%2f%2e%2e%2fetc%2fpasswd/pause",
        "/v2/sandboxes/..%2F..%2Fetc%2Fpasswd/logs",
        "/sandboxes/aaaaaaaaaaaaaaaaaaaa%00/timeout",
        "/templates/..%2F..%2Fetc/files/" + "0" * 64,
        "/templates/base/files/..%2F..%2F..%2Fetc%2Fpasswd",
        "/templates/base/files/" + "%2e" * 64,
    ],
)
def test_path_traversal_in_ids_is_refused(server: NodeServer, target: str) -> None:
    for method in ("GET", "POST", "DELETE"):
        status, body = request(server, method, target, headers={"X-API-KEY": API_KEY})
        assert status in (400, 401, 403, 404, 405, 422), (method, status, body[:300])


@pytest.mark.parametrize("sandbox_id", ["..", "../../etc", "a/../b", "%2e%2e", "x\\..\\y"])
def test_path_traversal_in_proxy_targets_is_refused(
    sandbox: Sandbox, server: NodeServer, sandbox_id: str
) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox_id,
        "E2b-Sandbox-Port": ENVD,
        "X-Access-Token": token_of(sandbox),
    }
    status, body = request(server, "GET", "/files?path=%2Fetc%2Fhostname", headers=headers)
    assert_e2b_error(status, body)
    host = {"Host": f"{ENVD}-{sandbox_id}.aenv.test", "X-Access-Token": token_of(sandbox)}
    status, body = request(server, "GET", "/files?path=%2Fetc%2Fhostname", headers=host)
    assert status != 200, body[:300]


def test_file_paths_stay_inside_the_sandbox(sandbox: Sandbox, server: NodeServer) -> None:
    marker = f"aenv-escape-{secrets.token_hex(8)}"
    host_file = Path("/tmp") / marker
    sandbox.files.write(f"../../../../../../tmp/{marker}", "inside")
    assert not host_file.exists()
    assert sandbox.files.read(f"/tmp/{marker}") == "inside"
    host_file.write_text("host only")
    try:
        sandbox.files.remove(f"/tmp/{marker}")
        for path in (
            f"/../../../../tmp/{marker}",
            f"/proc/1/root/tmp/{marker}",
            f"/proc/self/root/../../tmp/{marker}",
        ):
            query = urllib.parse.urlencode({"path": path, "username": "root"})
            status, body = request(
                server, "GET", f"/files?{query}", headers=to_sandbox(sandbox, token_of(sandbox))
            )
            assert b"host only" not in body
            assert status == 404, (path, status, body[:300])
    finally:
        host_file.unlink()


def _with(url: str, **changes: str | None) -> str:
    """``url``'s path and query, with query parameters changed (None: removed)."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return f"{parts.path}?{urllib.parse.urlencode(query)}"


def test_signed_urls_cannot_be_tampered_with(
    pair: tuple[Sandbox, Sandbox], server: NodeServer
) -> None:
    a, b = pair
    url = a.download_url("/etc/hostname", user="root", use_signature_expiration=120)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert request(server, "GET", _with(url))[0] == 200  # control: untouched, it works
    tampered = [
        _with(url, path="/etc/shadow"),
        _with(url, path="/etc/hostname/../shadow"),
        _with(url, username="user"),
        _with(url, signature_expiration=str(int(query["signature_expiration"]) + 3600)),
        _with(url, signature_expiration=None),
        _with(url, signature=query["signature"][:-2] + "AA"),
        _with(url, signature=None),
    ]
    for target in tampered:
        status, body = request(server, "GET", target)
        assert status in (401, 403, 404), (target, status, body[:300])
        # Routed to a sandbox by hand, a's signature means nothing to b.
        status, body = request(server, "GET", target, headers=to_sandbox(b))
        assert status == 401, (target, status, body[:300])
    # Correctly signed but expired.
    past = int(time.time()) - 5
    expired = _with(
        url,
        signature_expiration=str(past),
        signature=sign("/etc/hostname", "read", "root", token_of(a), past),
    )
    status, body = request(server, "GET", expired)
    assert status == 401 and b"expired" in body, (status, body[:300])
    # An upload URL cannot be pointed elsewhere.
    upload = a.upload_url("/tmp/allowed", user="root", use_signature_expiration=120)
    boundary = "aenvescape"
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="x"\r\n\r\nowned\r\n--{boundary}--\r\n'
    ).encode()
    form_headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    status, body = request(
        server, "POST", _with(upload, path="/etc/owned"), headers=form_headers, body=form
    )
    assert status in (401, 403, 404), (status, body[:300])
    assert not a.files.exists("/etc/owned")
    status, _ = request(server, "POST", _with(upload), headers=form_headers, body=form)
    assert status == 200 and a.files.read("/tmp/allowed") == "owned"  # control


def test_template_upload_urls_cannot_be_tampered_with(server: NodeServer) -> None:
    api = {"X-API-KEY": API_KEY, "Content-Type": "application/json"}
    name = f"escape-{secrets.token_hex(4)}"
    status, body = request(
        server, "POST", "/v3/templates", headers=api, body=json.dumps({"name": name}).encode()
    )
    assert status == 202, body
    template_id = json.loads(body)["templateID"]
    try:
        files_hash = hashlib.sha256(name.encode()).hexdigest()
        status, body = request(
            server, "GET", f"/templates/{template_id}/files/{files_hash}", headers=api
        )
        assert status == 201, body
        url = json.loads(body)["url"]
        parts = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        other = hashlib.sha256(b"other").hexdigest()
        tampered = [
            _with(url, expires=str(int(query["expires"]) + 3600)),
            _with(url, signature=query["signature"][::-1]),
            _with(url, signature=None),
            f"{parts.path.replace(files_hash, other)}?{parts.query}",
            f"{parts.path.replace(files_hash, '..%2F..%2F..%2Ftmp%2Fx')}?{parts.query}",
            f"{parts.path.replace(template_id, 'base')}?{parts.query}",
        ]
        for target in tampered:
            status, body = request(server, "PUT", target, body=b"owned")
            assert status in (400, 403, 404, 405), (target, status, body[:300])
        assert request(server, "PUT", f"{parts.path}?{parts.query}", body=b"ok")[0] == 201
    finally:
        request(server, "DELETE", f"/templates/{template_id}", headers=api)
