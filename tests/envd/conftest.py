"""Fixtures that run one envd in a throwaway bubblewrap root for the whole session.

The official E2B SDK talks to it in debug mode (no control plane): ``E2B_DEBUG=true`` plus
``E2B_SANDBOX_URL`` pointing at the envd's port. Set ``AENV_TEST_BUNDLE=DIR`` to test a built
bundle instead of the source tree.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from e2b import AsyncSandbox, Sandbox

from tests.conftest import free_port
from tests.envd.harness import EnvdSandbox, start_envd


def sdk_sandbox(url: str, token: str | None = None) -> Sandbox:
    """An SDK ``Sandbox`` bound to the envd at ``url``, holding ``token`` as its envd access
    token, exactly as ``Sandbox.create`` builds one from a control-plane response."""
    from e2b.connection_config import ConnectionConfig
    from packaging.version import Version

    from aenv.envd import ENVD_VERSION

    headers = {"E2b-Sandbox-Id": "debug_sandbox_id", "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    config = ConnectionConfig(debug=True, sandbox_url=url, extra_sandbox_headers=headers)
    return Sandbox(
        sandbox_id="debug_sandbox_id",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


@pytest.fixture(scope="session")
def envd() -> Iterator[EnvdSandbox]:
    bundle = os.environ.get("AENV_TEST_BUNDLE")
    sandbox = start_envd(free_port(), bundle=Path(bundle) if bundle else None)
    try:
        yield sandbox
    finally:
        log = sandbox.log()  # before stop(): stopping deletes the scratch dir holding it
        sandbox.stop()
        if "Traceback" in log:
            print("envd log contains tracebacks:\n" + log[-5000:])


@pytest.fixture(autouse=True)
def sdk_debug_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK in debug mode, pointed at envd, for the tests that use it — set per test, so
    that tests of a node run later in the same process find the SDK pointed at their node."""
    if "envd" in request.fixturenames:
        envd: EnvdSandbox = request.getfixturevalue("envd")
        monkeypatch.setenv("E2B_DEBUG", "true")
        monkeypatch.setenv("E2B_SANDBOX_URL", envd.url)


@pytest.fixture
def sandbox(envd: EnvdSandbox) -> Sandbox:
    return Sandbox.create()


@pytest.fixture
async def async_sandbox(envd: EnvdSandbox) -> AsyncIterator[AsyncSandbox]:
    yield await AsyncSandbox.create()


@pytest.fixture
def workdir(sandbox: Sandbox) -> Iterator[str]:
    """A fresh directory in the user's home, removed afterwards."""
    path = f"/home/user/t-{uuid.uuid4().hex[:10]}"
    sandbox.files.make_dir(path)
    yield path
    sandbox.files.remove(path)
