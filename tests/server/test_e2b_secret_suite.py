"""E2B's own Python SDK secret tests (``tests/sync/secret_sync/test_secret.py`` of the e2b
repository, SDK 2.63), case by case through the SDK's ``Secret`` API against a real node.
Theirs run against an in-memory stand-in of the API patched into the SDK; here the node
answers (the fake runtime: no sandbox is needed)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from e2b import Secret
from e2b.exceptions import InvalidArgumentException, SecretNotFoundException

from tests.conftest import free_port
from tests.server.harness import NodeServer, cleanup_home, client_env, kill_leaked, start_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    try:
        server = start_server(free_port(), home, runtime="fake", net_pool_size="2",
                              warm_pool_size="0", precreate_pool_size="0")
    except BaseException:
        cleanup_home(home)
        raise
    try:
        yield server
    finally:
        server.stop()
        kill_leaked(server.home)
        cleanup_home(server.home)


@pytest.fixture(autouse=True)
def fresh(node: NodeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The SDK pointed at the node; every test starts without secrets (theirs clear a map)."""
    for key, value in client_env(node).items():
        monkeypatch.setenv(key, value)
    yield
    paginator = Secret.list(limit=100)
    while paginator.has_next:
        for info in paginator.next_items():
            Secret.destroy(info.secret_id)


def test_create_secret() -> None:
    info = Secret.create("openai-api-key", "sk-test", metadata={"env": "test"})
    assert info.secret_id.startswith("sec_")
    assert info.name == "openai-api-key"
    assert info.version == 1
    assert info.metadata == {"env": "test"}
    assert isinstance(info.created_at, datetime)
    assert isinstance(info.updated_at, datetime)
    assert not hasattr(info, "value")


def test_update_secret() -> None:
    created = Secret.create("rotating-key", "v1")
    updated = Secret.update(created.secret_id, "v2")
    assert updated.secret_id == created.secret_id
    assert updated.version == 2


def test_update_nonexistent_secret() -> None:
    with pytest.raises(SecretNotFoundException):
        Secret.update("missing", "value")


def test_get_secret_info() -> None:
    created = Secret.create("lookup-key", "value")
    assert Secret.get_info(created.secret_id).name == "lookup-key"
    assert Secret.get_info("lookup-key").secret_id == created.secret_id


def test_get_info_nonexistent_secret() -> None:
    with pytest.raises(SecretNotFoundException):
        Secret.get_info("missing")


def test_list_secrets_with_pagination() -> None:
    for name in ("key-a", "key-b", "key-c"):
        Secret.create(name, name[-1])
    paginator = Secret.list(limit=2)
    assert len(paginator.next_items()) == 2
    assert paginator.has_next is True
    assert len(paginator.next_items()) == 1
    assert paginator.has_next is False


def test_secret_exists() -> None:
    Secret.create("present-key", "value")
    assert Secret.exists("present-key") is True
    assert Secret.exists("absent-key") is False


def test_destroy_secret() -> None:
    created = Secret.create("to-delete", "value")
    assert Secret.destroy(created.secret_id) is True
    assert Secret.exists(created.secret_id) is False


def test_destroy_nonexistent_secret() -> None:
    assert Secret.destroy("missing") is False


def test_fill() -> None:
    assert Secret.fill("openai-api-key") == "${e2b.secrets.openai-api-key}"


@pytest.mark.parametrize("name", ["", "{name", "name}", "name\n", "name\x00"])
def test_fill_invalid_name_raises(name: str) -> None:
    with pytest.raises(InvalidArgumentException):
        Secret.fill(name)
