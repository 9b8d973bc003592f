"""E2B contract details a self-hosted server gets wrong easily, through the official SDK
against a real node (gVisor sandboxes): fork of a missing source, symlink entries, the
``startedAfter`` bound, command timeouts, default working directories, per-boot ``boot_id``."""

from __future__ import annotations

import re
import time

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    RateLimitException,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)
from e2b.exceptions import SandboxNotFoundException

from tests.server.harness import NodeServer, serving
from tests.server.test_lifecycle import kill_quietly

pytestmark = [pytest.mark.gvisor, pytest.mark.slow]


# -- fork -------------------------------------------------------------------------------------


def test_fork_of_a_missing_or_killed_sandbox_is_404(server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=60)
    sbx.kill()
    for sandbox_id in (sbx.sandbox_id, "a" * 20, "not-an-id"):
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(sandbox_id, count=2)


def test_fork_beyond_the_node_limit_is_429_per_child() -> None:
    with serving(max_sandboxes="2", warm_pool_size="0"):
        sbx = Sandbox.create(timeout=60)
        results: list[Sandbox | Exception] = []
        try:
            results = sbx.fork(count=3, timeout=60)
            assert len(results) == 3
            assert isinstance(results[0], Sandbox), results
            assert results[0].commands.run("echo child").stdout == "child\n"
            assert all(isinstance(r, RateLimitException) for r in results[1:]), results
        finally:
            kill_quietly(sbx, *results)


# -- symlinks ---------------------------------------------------------------------------------


def test_symlinks_report_their_targets_type_and_resolved_path(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/sl/target.txt", "abc")
    sandbox.commands.run(
        "cd /home/user/sl && mkdir real && ln -s target.txt link && "
        "ln -s /home/user/sl/real alias && ln -s ../sl/link chain"
    )
    info = sandbox.files.get_info("sl/link")
    assert (info.type, info.symlink_target) == (FileType.FILE, "/home/user/sl/target.txt")
    entries = {e.name: e for e in sandbox.files.list("/home/user/sl")}
    assert set(entries) == {"target.txt", "real", "link", "alias", "chain"}
    assert (entries["alias"].type, entries["alias"].symlink_target) == (
        FileType.DIR, "/home/user/sl/real"
    )
    # A chain of links resolves to its end, as Go's EvalSymlinks does.
    assert (entries["chain"].type, entries["chain"].symlink_target) == (
        FileType.FILE, "/home/user/sl/target.txt"
    )
    assert entries["target.txt"].symlink_target is None


# -- listing ----------------------------------------------------------------------------------


def test_started_after_includes_a_sandbox_started_at_that_instant(server: NodeServer) -> None:
    # The stored start has sub-microsecond digits; startedAt on the wire is rounded (up about
    # half the time). Passing it back must still find the sandbox: the bound is inclusive.
    sandboxes = [Sandbox.create(timeout=60) for _ in range(3)]
    try:
        for sbx in sandboxes:
            started = sbx.get_info().started_at
            listed = Sandbox.list(query=SandboxQuery(started_after=started)).next_items()
            assert sbx.sandbox_id in {s.sandbox_id for s in listed}, started
            assert all(s.started_at >= started for s in listed)
    finally:
        kill_quietly(*sandboxes)


# -- command timeouts -------------------------------------------------------------------------


def test_a_command_past_its_timeout_is_a_timeout(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    handle = sandbox.commands.run("sleep 31", background=True, timeout=1)
    with pytest.raises(TimeoutException):
        handle.wait()
    # envd killed both: the timeout is the process's lifetime.
    # The kill of the background one lands just after its wait timed out: give it a moment
    # (under load it was still listed once).
    deadline = time.monotonic() + 5
    while {"sleep 30", "sleep 31"} & set(sandbox.commands.run("ps -eo args").stdout.splitlines()):
        assert time.monotonic() < deadline, "a timed-out command is still running"
        time.sleep(0.2)


@pytest.mark.anyio
async def test_an_async_command_past_its_timeout_is_a_timeout(sandbox: Sandbox) -> None:
    sbx = await AsyncSandbox.connect(sandbox.sandbox_id)
    with pytest.raises(TimeoutException):
        await sbx.commands.run("sleep 30", timeout=1)
    handle = await sbx.commands.run("sleep 30", background=True, timeout=1)
    with pytest.raises(TimeoutException):
        await handle.wait()


# -- default working directory ----------------------------------------------------------------


def test_commands_and_relative_paths_start_in_the_callers_home(sandbox: Sandbox) -> None:
    # The base template sets no WORKDIR: both resolve against the calling user's home.
    for user, home in (("root", "/root"), ("user", "/home/user")):
        assert sandbox.commands.run("pwd", user=user).stdout == f"{home}\n"
        written = sandbox.files.write(f"rel-{user}.txt", user, user=user)
        assert written.path == f"{home}/rel-{user}.txt"
        assert sandbox.commands.run(f"cat rel-{user}.txt", user=user).stdout == user
    # A fork child keeps its parent's envd, and so the same defaults.
    [child] = sandbox.fork(count=1, timeout=60)
    try:
        assert isinstance(child, Sandbox), child
        assert child.commands.run("pwd; cat rel-root.txt", user="root").stdout == "/root\nroot"
    finally:
        kill_quietly(child)


# -- boot id ----------------------------------------------------------------------------------

BOOT_ID = "/proc/sys/kernel/random/boot_id"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n")


def boot_id(sbx: Sandbox) -> str:
    text = sbx.commands.run(f"cat {BOOT_ID}").stdout
    assert _UUID.fullmatch(text), repr(text)
    return text


def test_each_sandbox_has_its_own_boot_id_and_keeps_it(server: NodeServer) -> None:
    # Every sandbox of a template is a restore of the template's one memory image: without
    # envd's own boot id they would all report the id of the boot that made the image.
    first, second = Sandbox.create(timeout=120), Sandbox.create(timeout=120)
    made: list[Sandbox | Exception] = [first, second]
    try:
        ours = boot_id(first)
        assert ours != boot_id(second)
        with pytest.raises(CommandExitException):
            first.commands.run(f"echo 0 > {BOOT_ID}")  # the user cannot change it
        # A fork child continues its parent's boot; a sandbox from a snapshot is a new one.
        [child] = first.fork(count=1, timeout=60)
        made.append(child)
        assert isinstance(child, Sandbox), child
        assert boot_id(child) == ours
        snapshot = first.create_snapshot()
        from_snapshot = Sandbox.create(snapshot.snapshot_id, timeout=60)
        made.append(from_snapshot)
        assert boot_id(from_snapshot) not in (ours, boot_id(second))
        # A resume from the memory image on disk keeps it too.
        assert first.pause() is True
        image = server.home / "paused" / first.sandbox_id
        deadline = time.monotonic() + 60
        while not image.is_dir() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert image.is_dir(), "the paused sandbox was not written to disk"
        assert boot_id(Sandbox.connect(first.sandbox_id)) == ours
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        kill_quietly(*made)
