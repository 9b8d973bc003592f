"""The sudo stand-in (launcher/sudo.c + envd/sudo_server.py): sudo without setuid."""

from __future__ import annotations

import pytest
from e2b import CommandExitException, Sandbox

from tests.envd.harness import dev_static


@pytest.fixture
def sudo(sandbox: Sandbox) -> str:
    binary = dev_static("sudo.c", "sudo")
    sandbox.commands.run(f"install -m 0755 {binary} /tmp/sudo", user="root")
    return "/tmp/sudo"


def test_runs_as_root_with_sudo_environment(sandbox: Sandbox, sudo: str) -> None:
    out = sandbox.commands.run(f"{sudo} sh -c 'id -u; echo $HOME $SUDO_USER $SUDO_UID'").stdout
    assert out == "0\n/root user 1000\n"


def test_stdio_exit_code_and_assignments(sandbox: Sandbox, sudo: str) -> None:
    assert sandbox.commands.run(f"echo piped | {sudo} cat").stdout == "piped\n"
    assert sandbox.commands.run(f"{sudo} FOO=bar sh -c 'echo $FOO'").stdout == "bar\n"
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run(f"{sudo} sh -c 'exit 7'")
    assert info.value.exit_code == 7


def test_options(sandbox: Sandbox, sudo: str) -> None:
    out = sandbox.commands.run(
        f"{sudo} -n -u user id -un; {sudo} -i pwd; KEEP=1 {sudo} -E sh -c 'echo $KEEP'"
    ).stdout
    assert out == "user\n/root\n1\n"


def test_only_the_sudo_group_is_allowed(sandbox: Sandbox, sudo: str) -> None:
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run(f"{sudo} id", user="daemon", cwd="/tmp")
    assert "not in the sudoers file" in info.value.stderr


def test_interrupted_sudo_kills_its_command(sandbox: Sandbox, sudo: str) -> None:
    import time

    sandbox.commands.run(f"timeout -s KILL 1 {sudo} sleep 33.3 || true")
    deadline = time.monotonic() + 5
    while "sleep 33.3" in sandbox.commands.run("ps -eo args").stdout:
        assert time.monotonic() < deadline, "the command outlived its sudo"
        time.sleep(0.1)
