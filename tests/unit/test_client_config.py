"""Where ``aenv.client`` finds its node (``config.py``), and the credentials file's mode."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from aenv.client.config import (
    DEFAULT_API_URL,
    Credentials,
    credentials_path,
    load_credentials,
    resolve,
    save_credentials,
)
from aenv.client.errors import UsageError


def test_saved_credentials_are_0600_in_a_0700_dir_and_load_back(tmp_path: Path) -> None:
    env = {"AENV_CONFIG_DIR": str(tmp_path / "cfg")}
    path = save_credentials(Credentials("http://node:3000", "e2b_secret"), credentials_path(env))
    assert path == tmp_path / "cfg" / "auth.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_credentials(path) == Credentials("http://node:3000", "e2b_secret")
    # Overwritten atomically: no temporary file left, still 0600.
    save_credentials(Credentials("http://other:3000", "e2b_2"), path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["auth.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credentials(path) == Credentials("http://other:3000", "e2b_2")


def test_resolution_order(tmp_path: Path) -> None:
    env = {"AENV_CONFIG_DIR": str(tmp_path)}
    save_credentials(Credentials("http://stored:1/", "stored-key"), credentials_path(env))
    assert resolve(environ=env).api_url == "http://stored:1"
    assert resolve(environ=env).api_key == "stored-key"
    with_env = {**env, "E2B_API_URL": "http://env:2", "E2B_API_KEY": "env-key"}
    config = resolve(environ=with_env)
    assert (config.api_url, config.api_key, config.sandbox_url) == \
        ("http://env:2", "env-key", "http://env:2")
    config = resolve("http://arg:3", "arg-key", "http://proxy:4", environ=with_env)
    assert (config.api_url, config.api_key, config.sandbox_url) == \
        ("http://arg:3", "arg-key", "http://proxy:4")
    assert "arg-key" not in repr(config)


def test_a_stored_key_goes_only_to_its_own_url(tmp_path: Path) -> None:
    env = {"AENV_CONFIG_DIR": str(tmp_path)}
    save_credentials(Credentials("http://stored:1", "stored-key"), credentials_path(env))
    assert resolve("http://elsewhere:9", environ=env).api_key is None
    assert resolve("http://stored:1/", environ=env).api_key == "stored-key"


def test_nothing_configured_is_a_local_node(tmp_path: Path) -> None:
    config = resolve(environ={"AENV_CONFIG_DIR": str(tmp_path)})
    assert (config.api_url, config.api_key) == (DEFAULT_API_URL, None)


def test_a_broken_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text("{not json")
    with pytest.raises(UsageError, match=r"auth\.json is not JSON"):
        load_credentials(path)
    path.write_text('{"api_key": 5}')
    with pytest.raises(UsageError, match="must be strings"):
        load_credentials(path)
    assert load_credentials(tmp_path / "absent.json") is None


def test_config_dir_defaults(tmp_path: Path) -> None:
    assert credentials_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "aenv/auth.json"
    home = Path.home()
    assert credentials_path({}) == home / ".config" / "aenv" / "auth.json"
