"""``aenv.client`` against a real node: create, run, files, lifecycle, fork, snapshots, errors."""

from __future__ import annotations

import asyncio

import pytest

from aenv.client import (
    AsyncClient,
    CommandFailed,
    Conflict,
    InfrastructureError,
    InvalidRequest,
    SandboxLost,
    SandboxTimeout,
    TaskError,
    TemplateNotFound,
)
from tests.client.conftest import labelled
from tests.server.harness import NodeServer

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]


async def test_create_run_files_kill(client: AsyncClient, node: NodeServer) -> None:
    sbx = await client.create(timeout=120, metadata={"purpose": "basics"},
                              envs={"GREETING": "hi"})
    assert labelled(node, run=client.run_id) == [sbx.sandbox_id]
    info = await sbx.info()
    assert info.metadata == {"purpose": "basics", "run": client.run_id}
    assert info.state == "running"

    result = await sbx.run("echo $GREETING; echo oops >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "oops\n", 3)
    assert (await sbx.run("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await sbx.run("whoami", user="root")).stdout == "root\n"
    assert (await sbx.run("echo $X", envs={"X": "y"})).stdout == "y\n"
    assert (await sbx.run("wc -c; cat", stdin="")).stdout == "0\n"
    piped = await sbx.run("tr a-z A-Z", stdin="from stdin\n")
    assert piped.stdout == "FROM STDIN\n" and piped.ok

    await sbx.write_file("/tmp/dir/a.txt", "contents")
    assert await sbx.read_file("/tmp/dir/a.txt") == "contents"
    await sbx.write_file("/tmp/b.bin", bytes(range(256)))
    assert await sbx.read_bytes("/tmp/b.bin") == bytes(range(256))
    assert (await sbx.sdk.commands.run("cat /tmp/dir/a.txt")).stdout == "contents"

    assert await sbx.kill() is True
    assert await client.kill(sbx.sandbox_id) is False  # gone already
    assert labelled(node, run=client.run_id) == []


async def test_pause_resume_timeout_and_list(client: AsyncClient) -> None:
    sbx = await client.create(timeout=120)
    await sbx.write_file("/tmp/kept", "yes")
    await sbx.pause()
    [paused] = await client.list(metadata={"run": client.run_id}, state="paused")
    assert paused.sandbox_id == sbx.sandbox_id
    with pytest.raises(Conflict):
        await sbx.pause()
    await sbx.resume(timeout=120)
    assert await sbx.read_file("/tmp/kept") == "yes"
    again = await client.connect(sbx.sandbox_id)
    assert (await again.run("cat /tmp/kept")).stdout == "yes"
    await sbx.set_timeout(60)
    end = (await sbx.info()).end_at
    assert end is not None
    assert [s.sandbox_id for s in await client.list(metadata={"run": client.run_id},
                                                    state="running")] == [sbx.sandbox_id]


async def test_a_filesystem_only_pause(client: AsyncClient) -> None:
    sbx = await client.create(timeout=120)
    await sbx.write_file("/home/user/kept", "on disk")  # /tmp is memory: a reboot empties it
    await sbx.pause(memory=False)
    assert (await sbx.info()).state == "paused"
    await sbx.resume()
    assert await sbx.read_file("/home/user/kept") == "on disk"


async def test_fork_three_children(client: AsyncClient, node: NodeServer) -> None:
    parent = await client.create(timeout=120)
    await parent.write_file("/tmp/state", "prepared")
    await parent.run("nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &")
    children = await parent.fork(3, timeout=120)
    assert len(children) == 3 and children.errors == []
    ids = {c.sandbox_id for c in children}
    assert len(ids) == 3 and parent.sandbox_id not in ids
    assert set(labelled(node, run=client.run_id)) == ids | {parent.sandbox_id}

    async def check(i: int) -> None:
        child = children[i]
        assert await child.read_file("/tmp/state") == "prepared"
        await child.write_file("/tmp/state", f"child {i}")
        assert (await child.run("cat /tmp/state")).stdout == f"child {i}"

    await asyncio.gather(*(check(i) for i in range(3)))
    assert await parent.read_file("/tmp/state") == "prepared"
    for i, child in enumerate(children):
        assert await child.read_file("/tmp/state") == f"child {i}"


async def test_snapshots(client: AsyncClient) -> None:
    sbx = await client.create(timeout=120)
    await sbx.write_file("/tmp/snap", "in the snapshot")
    snap = await sbx.snapshot()
    try:
        assert snap.snapshot_id in {s.snapshot_id for s in await client.list_snapshots()}
        assert [s.snapshot_id for s in await client.list_snapshots(
            sandbox_id=sbx.sandbox_id)] == [snap.snapshot_id]
        restored = await client.create(snap.snapshot_id, timeout=120)
        assert await restored.read_file("/tmp/snap") == "in the snapshot"
        await restored.kill()
    finally:
        assert await client.delete_snapshot(snap.snapshot_id) is True
    assert await client.delete_snapshot(snap.snapshot_id) is False


async def test_typed_errors(client: AsyncClient) -> None:
    with pytest.raises(InvalidRequest, match="run label"):
        await client.create(metadata={"run": "someone-else"})
    with pytest.raises(TemplateNotFound) as missing:
        await client.create("no-such-template")
    assert not missing.value.infrastructure

    sbx = await client.create(timeout=120)
    with pytest.raises(CommandFailed) as failed:
        await sbx.run("echo out; echo err >&2; exit 7", check=True)
    assert failed.value.exit_code == 7 and failed.value.result.stdout == "out\n"
    assert isinstance(failed.value, TaskError) and not failed.value.infrastructure
    with pytest.raises(SandboxTimeout):
        await sbx.run("sleep 30", timeout=1)
    assert (await sbx.run("true", check=True)).ok  # the sandbox is fine after both

    await client.kill(sbx.sandbox_id)
    with pytest.raises(SandboxLost) as lost:
        await sbx.run("true")
    assert isinstance(lost.value, InfrastructureError) and lost.value.sandbox_id == sbx.sandbox_id
    with pytest.raises(SandboxLost):
        await sbx.info()
    with pytest.raises(SandboxLost):
        await sbx.fork(2)
