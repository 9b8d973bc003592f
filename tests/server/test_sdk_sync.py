"""The node server through the official synchronous Python SDK (issue: node server)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from e2b import (
    CommandExitException,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
)
from e2b.exceptions import SandboxException

from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


def test_create_run_and_info(sandbox: Sandbox) -> None:
    assert len(sandbox.sandbox_id) == 20 and sandbox.sandbox_id.isalnum()
    result = sandbox.commands.run("echo hello; whoami; python3 -c 'print(6*7)'")
    assert result.stdout == "hello\nuser\n42\n"
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.state.value == "running"
    assert info.end_at > info.started_at
    assert sandbox.is_running()


def test_base_template_contents(sandbox: Sandbox) -> None:
    out = sandbox.commands.run(
        "id; git --version >/dev/null && curl --version >/dev/null && echo tools-ok; "
        "echo $HOME; pwd"
    ).stdout
    assert "uid=1000(user)" in out and "tools-ok" in out
    assert out.endswith("/home/user\n/home/user\n")


def test_passwordless_sudo(sandbox: Sandbox) -> None:
    # runsc sets no_new_privs on every task, so this is envd's sudo stand-in, not setuid sudo.
    assert sandbox.commands.run("sudo -n id -u; which sudo").stdout == "0\n/usr/local/bin/sudo\n"
    assert sandbox.commands.run("sudo apt-get --version >/dev/null && echo apt-ok").stdout == (
        "apt-ok\n"
    )


def test_files_and_pty(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/hello.txt", "hi there")
    assert sandbox.files.read("/home/user/hello.txt") == "hi there"
    assert any(e.name == "hello.txt" for e in sandbox.files.list("/home/user"))
    handle = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(handle.pid, b"echo pty-$((40+2)); exit\n")
    chunks: list[bytes] = []
    handle.wait(on_pty=chunks.append)
    assert b"pty-42" in b"".join(chunks)


def test_env_vars_from_create(server: NodeServer) -> None:
    sbx = Sandbox.create(envs={"FROM_CREATE": "yes"}, timeout=60)
    try:
        assert sbx.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        assert sbx.commands.run("echo $FROM_CREATE", envs={"FROM_CREATE": "req"}).stdout == (
            "req\n"
        )
    finally:
        sbx.kill()


def test_background_and_exit_codes(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sandbox.commands.run("exit 5")
    assert info.value.exit_code == 5
    handle = sandbox.commands.run("sleep 30", background=True)
    assert handle.pid in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(handle.pid)


def test_list_pagination_and_filters(server: NodeServer) -> None:
    tag = f"t{time.monotonic_ns()}"
    created = []
    try:
        for i in range(3):
            created.append(Sandbox.create(metadata={"suite": tag, "i": str(i)}, timeout=60))
            time.sleep(0.01)
        query = SandboxQuery(metadata={"suite": tag})
        paginator = Sandbox.list(query=query, limit=1)
        seen = []
        while paginator.has_next:
            items = paginator.next_items()
            assert len(items) <= 1
            seen.extend(i.sandbox_id for i in items)
        assert seen == [s.sandbox_id for s in reversed(created)]
        only = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "i": "1"})).next_items()
        assert [i.sandbox_id for i in only] == [created[1].sandbox_id]
        mine = {"suite": tag}
        running = Sandbox.list(query=SandboxQuery(metadata=mine, state=[SandboxState.RUNNING]))
        assert len(running.next_items()) == 3
        paused = Sandbox.list(query=SandboxQuery(metadata=mine, state=[SandboxState.PAUSED]))
        assert paused.next_items() == []
        infos = Sandbox.list(query=query).next_items()
        assert {i.metadata["i"] for i in infos} == {"0", "1", "2"}
        assert all(isinstance(i.started_at, datetime) for i in infos)
    finally:
        for sbx in created:
            sbx.kill()


def test_kill_and_not_found(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=60)
    assert sbx.kill() is True
    assert sbx.is_running() is False
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    with pytest.raises(NotFoundException):
        Sandbox.get_info("doesnotexist00000000")


def test_set_timeout_expiry_stops_the_sandbox(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "kill"})
    before = sbx.get_info().end_at
    sbx.set_timeout(3)
    assert sbx.get_info().end_at < before
    time.sleep(4.5)
    assert sbx.is_running() is False
    with pytest.raises(NotFoundException):
        sbx.get_info()


def test_connect_extends_but_never_shortens(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=100)
    try:
        end = sbx.get_info().end_at
        Sandbox.connect(sbx.sandbox_id, timeout=10)
        assert sbx.get_info().end_at >= end
        again = Sandbox.connect(sbx.sandbox_id, timeout=500)
        assert again.get_info().end_at > end
        assert again.commands.run("echo same").stdout == "same\n"
    finally:
        sbx.kill()


def test_kill_during_a_running_command(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=60)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sbx.commands.run("sleep 60")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    Sandbox.kill(sbx.sandbox_id)
    thread.join(20)
    assert not thread.is_alive()
    assert errors and isinstance(errors[0], SandboxException)
    assert "killed or reached its end of life" in str(errors[0])


def test_metrics(sandbox: Sandbox) -> None:
    start = datetime.now(UTC)
    metrics = []
    deadline = time.monotonic() + 30
    while not metrics and time.monotonic() < deadline:
        metrics = sandbox.get_metrics(start=start)
        time.sleep(0.5)
    assert metrics
    sample = metrics[-1]
    assert sample.cpu_count >= 1 and sample.mem_total > 0 and sample.disk_total > 0


def test_bad_template_is_a_clear_error(server: NodeServer) -> None:
    with pytest.raises(SandboxException, match=r"404|not found"):
        Sandbox.create(template="no-such-template")


def test_network_options_are_kept_and_updatable(server: NodeServer) -> None:
    sbx = Sandbox.create(
        timeout=60, allow_internet_access=False,
        network={"allow_out": ["198.51.100.7"], "deny_out": ["0.0.0.0/0"]},
    )
    try:
        info = sbx.get_info()
        assert info.allow_internet_access is False
        assert sbx.commands.run("echo still-fine").stdout == "still-fine\n"
        sbx.update_network({"allow_out": ["203.0.113.0/24"]})
        with pytest.raises(SandboxException, match="400"):
            sbx.update_network({"deny_out": ["not an ip or a name"]})
        assert sbx.commands.run("echo after-update").stdout == "after-update\n"
    finally:
        sbx.kill()


def test_a_malformed_egress_rule_is_a_400(server: NodeServer) -> None:
    with pytest.raises(SandboxException, match="400"):
        Sandbox.create(timeout=60, network={"allow_out": ["not a name!"]})
