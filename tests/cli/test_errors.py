"""Every failure is one ``error:`` line on stderr and a non-zero exit code, no traceback;
``aenv auth`` stores its key 0600. (``aenv doctor``: test_doctor.py.)"""

from __future__ import annotations

import json
import socket
import stat

import pytest

from tests.cli.conftest import Cli
from tests.server.harness import API_KEY


def one_line(result: object) -> str:
    errors = result.errors()  # type: ignore[attr-defined]
    assert result.code == 1, result  # type: ignore[attr-defined]
    assert len(errors) == 1, result
    assert "Traceback" not in result.stderr, result  # type: ignore[attr-defined]
    return str(errors[0])


@pytest.mark.parametrize("args", [
    ("exec", "nosuchsandbox00000000", "--", "true"),
    ("pause", "nosuchsandbox00000000"),
    ("resume", "nosuchsandbox00000000"),
    ("timeout", "nosuchsandbox00000000", "60"),
    ("kill", "nosuchsandbox00000000"),
    ("fork", "nosuchsandbox00000000", "-n", "2"),
    ("snapshot", "create", "nosuchsandbox00000000"),
    ("logs", "nosuchsandbox00000000"),
    ("metrics", "nosuchsandbox00000000"),
    ("cp", "nosuchsandbox00000000:/etc/hostname", "/tmp/x"),
])
def test_unknown_sandbox(aenv: Cli, args: tuple[str, ...]) -> None:
    assert "nosuchsandbox00000000" in one_line(aenv(*args))


def test_unreachable_url(aenv: Cli) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for args in (("ls",), ("kill", "--metadata", "run=x"), ("exec", "abc", "--", "true")):
        result = aenv(*args, env={"E2B_API_URL": url})
        assert f"cannot reach {url}" in one_line(result)
        assert result.seconds < 15, result


def test_wrong_key(aenv: Cli) -> None:
    assert "401" in one_line(aenv("ls", env={"E2B_API_KEY": "e2b_wrong"}))


def test_auth_login_status_logout(aenv: Cli) -> None:
    env = {"E2B_API_URL": "", "E2B_API_KEY": ""}
    done = aenv("auth", "login", "--url", aenv.node.url, "--key", API_KEY, env=env)
    assert done.code == 0, done
    path = aenv.config_dir / "auth.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(aenv.config_dir.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"api_url": aenv.node.url, "api_key": API_KEY}
    # With no E2B_* variables the stored URL and key are used.
    listed = aenv("ls", "--json", env=env)
    assert listed.code == 0 and isinstance(json.loads(listed.stdout), list), listed
    status = aenv("auth", "status", env=env)
    assert f"url: {aenv.node.url} (from {path})" in status.stdout, status
    assert API_KEY not in status.stdout
    assert aenv("auth", "logout", env=env).code == 0
    assert not path.exists()
