"""The sudo stand-in (launcher/sudo.c + envd/sudo_server.py): sudo without setuid."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import CommandExitException, Sandbox

from aenv.envd.sudoers import granted_user_lists, may_sudo
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


def test_scoped_env_vars_do_not_reach_a_later_sudo(sandbox: Sandbox) -> None:
    # E2B's own SDK test (test_bash_command_scoped_env_vars), with the stand-in on PATH as
    # the node has it.
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout == "bar\n"
    cmd = sandbox.commands.run('sudo echo "$FOO"; sudo env')
    assert cmd.exit_code == 0
    assert cmd.stdout.startswith("\n") and "FOO" not in cmd.stdout


def test_a_request_too_big_for_one_message(sandbox: Sandbox) -> None:
    # ~600 KB of environment: the stand-in's request arrives in several parts, each of which
    # must carry its sender's credentials.
    big = " ".join(f"B{i}=$(head -c 100000 /dev/zero | tr '\\0' x)" for i in range(6))
    out = sandbox.commands.run(f"{big} sudo -E sh -c 'echo ${{#B0}} ${{#B5}} $(id -u)'").stdout
    assert out == "100000 100000 0\n"


def test_users_without_sudo_get_a_clear_refusal(sandbox: Sandbox) -> None:
    for user, command in (
        ("nobody", "sudo -n id"),
        ("nobody", "sudo -l"),
        ("root", "setpriv --reuid 12345 --regid 12345 --clear-groups sudo -n id"),
    ):
        with pytest.raises(CommandExitException) as info:
            sandbox.commands.run(command, user=user, cwd="/tmp")
        assert info.value.exit_code == 1
        assert "uid=0" not in info.value.stdout
        assert "is not in the sudoers file" in info.value.stderr
    assert sandbox.commands.run("sudo -n id -u", user="root").stdout == "0\n"
    assert sandbox.commands.run("sudo -n -u nobody id -un").stdout == "nobody\n"
    assert sandbox.commands.run("sudo -l").stdout.endswith("(ALL) NOPASSWD: ALL\n")


SUDOERS = """\
# comments and Defaults say nothing about who
Defaults env_reset
#includedir /etc/sudoers.d
root    ALL=(ALL:ALL) ALL
%admins ALL=(ALL) NOPASSWD: ALL
#{uid} ALL = (ALL : ALL) \\
    ALL
limited ALL=(ALL) NOPASSWD: /usr/bin/apt-get
alice, bob ALL=(ALL) SETENV: NOPASSWD: ALL
"""


def test_sudoers_rules_that_grant_everything() -> None:
    assert list(granted_user_lists(SUDOERS.format(uid=4242))) == [
        ["root"], ["%admins"], ["#4242"], ["alice", "bob"],
    ]


def test_may_sudo_reads_the_images_sudoers(tmp_path: Path) -> None:
    nobody = 65534
    sudoers, drop_in = tmp_path / "sudoers", tmp_path / "sudoers.d"
    drop_in.mkdir()
    assert may_sudo(0, sudoers, drop_in)
    assert not may_sudo(nobody, sudoers, drop_in)
    (drop_in / "nobody").write_text("nobody ALL=(ALL) NOPASSWD: /usr/bin/id\n")
    assert not may_sudo(nobody, sudoers, drop_in)  # the stand-in cannot limit commands
    (drop_in / "nobody.dpkg-old").write_text("nobody ALL=(ALL) NOPASSWD: ALL\n")
    assert not may_sudo(nobody, sudoers, drop_in)  # sudo skips names with a dot
    sudoers.write_text(SUDOERS.format(uid=nobody))
    assert may_sudo(nobody, sudoers, drop_in)
    assert not may_sudo(4242, sudoers, drop_in)  # no account: sudoers names only accounts
