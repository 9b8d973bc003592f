"""``/init``, ``/envs`` and access-token enforcement, on an envd of its own.

These tests change sandbox-wide state (token, env vars, default user and workdir), so they get a
separate envd instead of the session one.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.conftest import free_port
from tests.envd.conftest import sdk_sandbox
from tests.envd.connect_wire import UNARY_HEADERS
from tests.envd.harness import EnvdSandbox, start_envd

TOKEN = "tok-" + "a1" * 16
UNAUTHORIZED = {
    "code": 401,
    "message": "unauthorized access, please provide a valid access token or method signing "
    "if supported",
}


@pytest.fixture(scope="module")
def initialised() -> Iterator[EnvdSandbox]:
    sandbox = start_envd(free_port())
    try:
        response = httpx.post(
            f"{sandbox.url}/init",
            json={
                "envVars": {"SBX_WIDE": "yes", "SHADOWED": "sandbox"},
                "accessToken": TOKEN,
                "defaultUser": "user",
                "defaultWorkdir": "/tmp",
            },
        )
        assert response.status_code == 204
        yield sandbox
    finally:
        sandbox.stop()


@pytest.fixture
def sdk(initialised: EnvdSandbox) -> Sandbox:
    return sdk_sandbox(initialised.url, TOKEN)


def test_rpc_without_token_is_rejected(initialised: EnvdSandbox) -> None:
    response = httpx.post(f"{initialised.url}/process.Process/List", json={},
                          headers=UNARY_HEADERS)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED
    wrong = httpx.post(f"{initialised.url}/process.Process/List", json={},
                       headers={**UNARY_HEADERS, "X-Access-Token": "nope"})
    assert wrong.status_code == 401


def test_health_needs_no_token(initialised: EnvdSandbox) -> None:
    assert httpx.get(f"{initialised.url}/health").status_code == 204


def test_envs_needs_the_token(initialised: EnvdSandbox) -> None:
    assert httpx.get(f"{initialised.url}/envs").status_code == 401
    response = httpx.get(f"{initialised.url}/envs", headers={"X-Access-Token": TOKEN})
    assert response.json() == {"SBX_WIDE": "yes", "SHADOWED": "sandbox"}


def test_files_without_token_or_signature_is_rejected(initialised: EnvdSandbox) -> None:
    response = httpx.get(f"{initialised.url}/files", params={"path": "/etc/hostname"})
    assert response.status_code == 401


def test_sandbox_env_vars_apply_and_request_envs_win(sdk: Sandbox) -> None:
    out = sdk.commands.run("echo $SBX_WIDE $SHADOWED", envs={"SHADOWED": "request"}).stdout
    assert out == "yes request\n"


def test_default_workdir_from_init(sdk: Sandbox) -> None:
    assert sdk.commands.run("pwd").stdout == "/tmp\n"


def test_init_cannot_be_replayed_without_the_token(initialised: EnvdSandbox) -> None:
    response = httpx.post(f"{initialised.url}/init", json={"accessToken": "stolen"})
    assert response.status_code == 401
    # The holder of the token may re-init (the orchestrator does on resume).
    ok = httpx.post(f"{initialised.url}/init", json={"accessToken": TOKEN},
                    headers={"X-Access-Token": TOKEN})
    assert ok.status_code == 204


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"envVars": {"A": 1}}',
                                  b'{"accessToken": 5}'])
def test_init_rejects_bad_bodies(initialised: EnvdSandbox, body: bytes) -> None:
    response = httpx.post(f"{initialised.url}/init", content=body,
                          headers={"X-Access-Token": TOKEN, "content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["code"] == 400
