"""A team's secrets (docs/teams.md, "Secrets") through the SDK's own generated API client:
made, listed, read by id and by name, updated (a new version), deleted; no answer carries a
value, the database holds none in the clear, and another team sees none of them. The fake
runtime: no sandbox is needed."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b.api import ApiClient
from e2b.api.client.api.secrets import (
    delete_secrets_secret_id,
    get_secrets,
    get_secrets_secret_id,
    post_secrets,
    post_secrets_secret_id,
)
from e2b.api.client.models import NewSecret, Secret, SecretUpdate
from e2b.api.client.models.secret_metadata import SecretMetadata
from e2b.connection_config import ConnectionConfig

from tests.conftest import free_port
from tests.server.harness import (
    API_KEY,
    NodeServer,
    cleanup_home,
    client_env,
    kill_leaked,
    start_server,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
VALUE = "sk-live-0123456789abcdef"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[NodeServer]:
    home = Path(tempfile.mkdtemp(prefix="aenv-home-"))
    try:
        server = start_server(free_port(), home, runtime="fake", net_pool_size="2",
                              warm_pool_size="0", precreate_pool_size="0")
    except BaseException:
        cleanup_home(home)
        raise
    for key, value in client_env(server).items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        server.stop()
        kill_leaked(server.home)
        cleanup_home(server.home)


def _client(key: str) -> ApiClient:
    return ApiClient(ConnectionConfig(api_key=key))


def test_secrets_through_the_sdk_client(node: NodeServer) -> None:
    metadata = SecretMetadata.from_dict({"owner": "rl"})
    with _client(API_KEY) as api:
        made = post_secrets.sync(client=api, body=NewSecret(name="OpenAI", value=VALUE,
                                                             metadata=metadata))
        assert isinstance(made, Secret), made
        assert made.name == "openai" and made.current_version == 1
        assert made.secret_id.startswith("sec_")
        by_name = get_secrets_secret_id.sync_detailed(client=api, secret_id="openai")
        by_id = get_secrets_secret_id.sync_detailed(client=api, secret_id=made.secret_id)
        assert by_name.status_code == by_id.status_code == 200
        again = post_secrets.sync_detailed(client=api, body=NewSecret(name="openai", value="x"))
        assert again.status_code == 409
        updated = post_secrets_secret_id.sync(client=api, secret_id="openai",
                                             body=SecretUpdate(value=VALUE + "-2"))
        assert isinstance(updated, Secret) and updated.current_version == 2
        assert updated.metadata.additional_properties == {"owner": "rl"}
        for n in range(3):
            post_secrets.sync(client=api, body=NewSecret(name=f"k{n}", value="v"))
        listed = get_secrets.sync_detailed(client=api, limit=2)
        assert listed.status_code == 200 and len(listed.parsed or []) == 2
        token = listed.headers.get("x-next-token")
        rest = get_secrets.sync_detailed(client=api, limit=2, next_token=token)
        names = [s.name for s in (listed.parsed or []) + (rest.parsed or [])]
        assert names == ["k0", "k1", "k2", "openai"]
        for answer in (by_name, by_id, listed, rest, again):
            assert VALUE not in answer.content.decode()
        bad = post_secrets.sync_detailed(client=api, body=NewSecret(name="sec_x", value="v"))
        assert bad.status_code == 400
    # Another team: none of them, by id or by name.
    with httpx.Client(base_url=node.url, headers={"X-API-KEY": API_KEY}) as op:
        other = op.post("/teams", json={"name": "other"}).json()["apiKey"]
        assert op.delete(f"/teams/{op.get('/teams').json()[0]['teamID']}").status_code == 400
    with _client(other) as api:
        assert get_secrets.sync(client=api) == []
        for ref in ("openai", made.secret_id):
            assert get_secrets_secret_id.sync_detailed(client=api, secret_id=ref
                                                       ).status_code == 404
            assert delete_secrets_secret_id.sync_detailed(client=api, secret_id=ref
                                                          ).status_code == 404
    # Sealed at rest: the database file has no value in the clear.
    db = sqlite3.connect(node.home / "state.db")
    try:
        sealed = [bytes(r[0]) for r in db.execute("SELECT sealed FROM secrets")]
    finally:
        db.close()
    assert len(sealed) == 4 and not any(VALUE.encode() in s for s in sealed)
    with _client(API_KEY) as api:
        assert delete_secrets_secret_id.sync_detailed(client=api, secret_id="openai"
                                                      ).status_code == 204
        assert get_secrets_secret_id.sync_detailed(client=api, secret_id="openai"
                                                   ).status_code == 404
