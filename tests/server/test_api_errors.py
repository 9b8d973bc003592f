"""Bad input to the control plane gets E2B's error body and the right status, never a 500."""

from __future__ import annotations

import httpx
import pytest

from tests.server.harness import API_KEY, NodeServer

pytestmark = [pytest.mark.gvisor]


@pytest.fixture
def api(server: NodeServer) -> httpx.Client:
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": API_KEY}, timeout=30) as c:
        yield c  # type: ignore[misc]


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status and isinstance(body["message"], str)
    return str(body["message"])


def test_api_key_is_required(server: NodeServer) -> None:
    _error(httpx.get(f"{server.url}/v2/sandboxes"), 401)
    _error(httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-KEY": "e2b_nope"}), 401)
    assert httpx.get(f"{server.url}/health").text == "Health check successful"


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"templateID": 5}', b'{"templateID": "base", "timeout": -1}',
     b'{"templateID": "base", "envVars": {"A": 1}}', b'{"templateID": ""}'],
)
def test_bad_create_bodies(api: httpx.Client, body: bytes) -> None:
    response = api.post("/v2/sandboxes", content=body, headers={"content-type": "application/json"})
    _error(response, 400)


def test_unknown_template_and_too_long_timeout(api: httpx.Client) -> None:
    assert "not found" in _error(api.post("/v2/sandboxes", json={"templateID": "nope"}), 404)
    _error(api.post("/v2/sandboxes", json={"templateID": "base", "timeout": 10**9}), 400)


def test_unknown_sandboxes(api: httpx.Client) -> None:
    for sandbox_id in ("a" * 20, "not-an-id", "../etc"):
        _error(api.get(f"/sandboxes/{sandbox_id}"), 404)
        _error(api.delete(f"/sandboxes/{sandbox_id}"), 404)
        _error(api.post(f"/sandboxes/{sandbox_id}/timeout", json={"timeout": 5}), 404)
        _error(api.post(f"/v2/sandboxes/{sandbox_id}/connect", json={}), 404)


@pytest.mark.parametrize(
    "query",
    ["state=dead", "limit=0", "limit=101", "nextToken=%21%21", "order=sideways",
     "startedAfter=yesterday", "metadata=novalue"],
)
def test_bad_list_parameters(api: httpx.Client, query: str) -> None:
    _error(api.get(f"/v2/sandboxes?{query}"), 400)


def test_proxy_errors(server: NodeServer) -> None:
    gone = httpx.get(f"{server.url}/health",
                     headers={"E2b-Sandbox-Id": "a" * 20, "E2b-Sandbox-Port": "49983"})
    assert gone.status_code == 502
    assert gone.json() == {"sandboxId": "a" * 20, "message": "The sandbox was not found",
                           "code": 502}
    bad = httpx.get(f"{server.url}/health", headers={"E2b-Sandbox-Id": "x"})
    assert bad.status_code == 400
