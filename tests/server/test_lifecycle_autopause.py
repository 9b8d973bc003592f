"""The disk tier of pause: a node with ``pause_hot_s`` = 0 writes a paused sandbox's memory to
``<home>/paused/<id>`` at once and frees its runtime; resume restores it from that image into a
new network slot under the same id and envd token. Auto-pause on expiry and auto-resume go
through the same path here. Helpers: ``test_lifecycle.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from e2b import AsyncSandbox, NotFoundException, Sandbox, SandboxState

from tests.server.conftest import serving
from tests.server.harness import NodeServer, runsc_of
from tests.server.test_lifecycle import (
    assert_counting,
    assert_http_answers,
    kill_quietly,
    pause_resume_roundtrip,
    read_counter,
    start_counter,
    start_http_server,
    wait_for,
)

pytestmark = [pytest.mark.gvisor]


@pytest.fixture(scope="module")
def disk_server() -> Iterator[NodeServer]:
    with serving(pause_hot_s="0") as node:
        yield node


def image_of(server: NodeServer, sandbox_id: str) -> Path:
    return server.home / "paused" / sandbox_id


def wait_on_disk(server: NodeServer, sandbox_id: str) -> None:
    """Until the sandbox's memory image is written and its runtime is gone (no runsc process
    of it is left, ``runsc delete`` included)."""
    wait_for("the memory image", lambda: image_of(server, sandbox_id).is_dir(), timeout=60)
    wait_for("the runtime to be freed", lambda: not runsc_of(server.home, sandbox_id), timeout=30)
    assert Sandbox.get_info(sandbox_id).state == SandboxState.PAUSED


def test_pause_to_disk_then_connect_restores(disk_server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert runsc_of(disk_server.home, sbx.sandbox_id)
        pause_resume_roundtrip(sbx, before_resume=lambda: wait_on_disk(disk_server,
                                                                       sbx.sandbox_id))
        # Consumed by the restore.
        assert not image_of(disk_server, sbx.sandbox_id).exists()
        assert runsc_of(disk_server.home, sbx.sandbox_id)
        # A second round trip on the restored sandbox.
        nonce, seen = read_counter(sbx)
        assert sbx.pause() is True
        wait_on_disk(disk_server, sbx.sandbox_id)
        Sandbox.connect(sbx.sandbox_id)
        assert_counting(sbx, nonce, at_least=seen)
        assert sbx.files.read("/home/user/before.txt") == "written before the pause"
    finally:
        kill_quietly(sbx)


def test_connect_right_after_pause_waits_for_the_disk_write(disk_server: NodeServer) -> None:
    """A connect that arrives while the image is being written waits for the write and
    restores the sandbox. Regression: the spill used to publish the record as paused on disk
    before it destroyed the old runtime, so a resume meanwhile met `runsc delete` of the old
    container under the same runsc id (500 "loading container: ... no such file")."""
    sbx = Sandbox.create(timeout=120)
    try:
        handle, nonce = start_counter(sbx)
        for _ in range(2):
            _, seen = read_counter(sbx)
            assert sbx.pause() is True
            Sandbox.connect(sbx.sandbox_id)
            assert sbx.get_info().state == SandboxState.RUNNING
            assert_counting(sbx, nonce, at_least=seen, pid=handle.pid)
    finally:
        kill_quietly(sbx)


def test_pause_twice_and_kill_of_a_disk_paused_sandbox(disk_server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=120)
    assert sbx.pause() is True
    assert sbx.pause() is False
    wait_on_disk(disk_server, sbx.sandbox_id)
    assert sbx.pause() is False
    assert sbx.kill() is True
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)
    # The kill answers once nothing of it runs; its image goes right after.
    wait_for("the image's removal", lambda: not image_of(disk_server, sbx.sandbox_id).exists(),
             timeout=15)
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_expiry_pauses_to_disk_and_traffic_restores(disk_server: NodeServer) -> None:
    """Created with ``on_timeout: pause`` + ``auto_resume``: it expires to disk, envd traffic
    restores it; paused again to disk, traffic to a user port restores it."""
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        start_http_server(disk_server, sbx, "from disk")
        handle, nonce = start_counter(sbx)
        _, seen = read_counter(sbx)
        # Expire 2 s from now, with no traffic from here on (traffic would wake it).
        sbx.set_timeout(2)
        wait_for("the expiry pause", lambda: image_of(disk_server, sbx.sandbox_id).is_dir(),
                 timeout=15)
        wait_on_disk(disk_server, sbx.sandbox_id)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        # envd traffic restores it...
        assert sbx.files.read("/home/user/kept.txt") == "kept"
        assert sbx.get_info().state == SandboxState.RUNNING
        assert_counting(sbx, nonce, at_least=seen, pid=handle.pid)
        assert_http_answers(disk_server, sbx, "from disk")
        assert not image_of(disk_server, sbx.sandbox_id).exists()
        # ... and so does traffic to a user port.
        assert sbx.pause() is True
        wait_on_disk(disk_server, sbx.sandbox_id)
        assert_http_answers(disk_server, sbx, "from disk")
        assert sbx.get_info().state == SandboxState.RUNNING
        assert_counting(sbx, nonce, at_least=seen, pid=handle.pid)
    finally:
        kill_quietly(sbx)


def test_snapshot_and_fork_of_a_sandbox_restored_from_disk(disk_server: NodeServer) -> None:
    sbx = Sandbox.create(timeout=120)
    children: list = []
    snap = None
    try:
        sbx.files.write("/home/user/f.txt", "restored")
        handle, nonce = start_counter(sbx)
        assert sbx.pause() is True
        wait_on_disk(disk_server, sbx.sandbox_id)
        Sandbox.connect(sbx.sandbox_id)
        _, seen = read_counter(sbx)
        snap = sbx.create_snapshot()
        children = sbx.fork(count=1, timeout=60)
        children.append(Sandbox.create(snap.snapshot_id, timeout=60))
        for child in children:
            assert isinstance(child, Sandbox), child
            assert child.files.read("/home/user/f.txt") == "restored"
            assert_counting(child, nonce, at_least=seen, pid=handle.pid)
        assert_counting(sbx, nonce, at_least=seen, pid=handle.pid)
    finally:
        kill_quietly(*children, sbx)
        if snap is not None:
            Sandbox.delete_snapshot(snap.snapshot_id)


@pytest.mark.anyio
async def test_async_pause_to_disk_and_connect(disk_server: NodeServer) -> None:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        await sbx.files.write("/home/user/a.txt", "async")
        assert await sbx.pause() is True
        assert await sbx.pause() is False
        assert await sbx.is_running() is False
        assert (await sbx.get_info()).state == SandboxState.PAUSED
        deadline = time.monotonic() + 60
        # The image is written and the old runtime gone.
        while (not image_of(disk_server, sbx.sandbox_id).is_dir()
               or runsc_of(disk_server.home, sbx.sandbox_id)):
            assert time.monotonic() < deadline, "the memory image was never written"
            await anyio.sleep(0.1)
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert again._envd_access_token == sbx._envd_access_token
        assert await sbx.files.read("/home/user/a.txt") == "async"
        assert (await again.commands.run("echo back")).stdout == "back\n"
        assert await sbx.is_running() is True
    finally:
        await sbx.kill()
