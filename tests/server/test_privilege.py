"""Privilege inside a gVisor sandbox (issue 21, item 2): the default user may sudo, as in E2B;
a user the template did not give sudo may not, whatever runsc reports for SO_PEERCRED."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, Sandbox

from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


@pytest.fixture(scope="module")
def sbx(server: NodeServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _refused(sbx: Sandbox, command: str, user: str) -> CommandExitException:
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run(command, user=user, cwd="/tmp", timeout=30)
    assert "uid=0" not in info.value.stdout
    assert info.value.exit_code == 1
    return info.value


def test_a_user_without_sudo_cannot_become_root(sbx: Sandbox) -> None:
    for command in ("sudo -n id", "sudo -l", "sudo -v"):
        refusal = _refused(sbx, command, "nobody")
        assert refusal.stderr == "sudo: nobody is not in the sudoers file\n"


def test_root_dropping_to_an_unknown_uid_cannot_come_back(sbx: Sandbox) -> None:
    refusal = _refused(sbx, "setpriv --reuid 12345 /usr/local/bin/sudo -n id", "root")
    assert refusal.stderr == "sudo: uid 12345 is not in the sudoers file\n"


def test_the_default_user_and_root_may(sbx: Sandbox) -> None:
    assert sbx.commands.run("sudo -n id").stdout.startswith("uid=0(root) gid=0(root)")
    assert sbx.commands.run("sudo -n id -u", user="root").stdout == "0\n"
    assert sbx.commands.run("sudo -n -u nobody id -un").stdout == "nobody\n"
    assert sbx.commands.run("sudo -v && sudo -l").stdout.endswith("(ALL) NOPASSWD: ALL\n")


FORGE = r"""
import os, socket, struct
def ask(creds):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/aenv/sudo.sock")
    body = b"\0".join([b"aenv-sudo-1", b"root", b"/", b"", b"1", b"id", b"0", b""])
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))]
    if creds is not None:
        anc.append((socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("3i", *creds)))
    try:
        s.sendmsg([struct.pack(">I", len(body)), body], anc)
    except OSError as e:
        return "sendmsg: " + e.strerror
    reply = s.recv(4096)
    return "refused: " + reply[4:].decode() if reply[:4] == b"\xff" * 4 else "RAN"
print(ask((os.getpid(), 0, 0)))  # claims root
print(ask((1, os.getuid(), os.getgid())))  # claims envd's pid
print(ask(None))  # claims nothing: the kernel fills in who sent it
"""


def test_the_kernel_vouches_for_the_caller(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/forge.py", FORGE)
    out = sbx.commands.run("python3 /tmp/forge.py", user="nobody", cwd="/tmp").stdout
    assert out.splitlines() == [
        "sendmsg: Operation not permitted",
        "sendmsg: Operation not permitted",
        "refused: nobody is not in the sudoers file",
    ]


def test_scoped_env_vars_do_not_reach_a_later_sudo(sbx: Sandbox) -> None:
    # E2B's own SDK test (test_bash_command_scoped_env_vars).
    assert sbx.commands.run("echo $FOO", envs={"FOO": "bar"}).stdout == "bar\n"
    cmd = sbx.commands.run('sudo echo "$FOO"; sudo env')
    assert cmd.stdout.startswith("\n") and "FOO" not in cmd.stdout


def test_a_request_too_big_for_one_message(sbx: Sandbox) -> None:
    # ~600 KB of environment: the request reaches envd in several parts, each of which must
    # carry its sender's credentials (envd refuses a request whose parts disagree).
    big = " ".join(f"B{i}=$(head -c 100000 /dev/zero | tr '\\0' x)" for i in range(6))
    out = sbx.commands.run(f"{big} sudo -E sh -c 'echo ${{#B0}} ${{#B5}} $(id -u)'").stdout
    assert out == "100000 100000 0\n"
