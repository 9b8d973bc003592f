"""Checkpoint, restore, freeze and thaw on real runsc sandboxes running the real envd."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
from pathlib import Path

import httpx
import pytest

from aenv.core.errors import InDoubt, NotFound, RuntimeFailure
from aenv.network import guest_http
from aenv.runtime.base import ENVD_PORT, IMAGE_FILES, MemoryImage, SandboxSpec
from aenv.runtime.gvisor import GvisorRuntime
from tests.counter import counting_into
from tests.runtime.conftest import Booted, SandboxFactory

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]

COUNTER = counting_into("/tmp/counter")


async def _start_via_envd(booted: Booted, script: str) -> None:
    """Start ``sh -c script`` as envd's child (as the product does), then hang up."""
    body = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}).encode()
    frame = struct.pack(">BI", 0, len(body)) + body
    base = f"http://{booted.slot.guest_ip}:{ENVD_PORT}"
    async with httpx.AsyncClient(transport=guest_http.transport(booted.slot),
                                 base_url=base) as client, client.stream(
        "POST", "/process.Process/Start", content=frame,
        headers={"content-type": "application/connect+json"},
    ) as response:
        assert response.status_code == 200, await response.aread()
        async for _ in response.aiter_bytes():
            break  # the start event: the process runs


async def _counter(sandboxes: SandboxFactory, booted: Booted) -> int:
    # The counter's first write may still be under way on a loaded machine (or the file is
    # between the shell's truncate and its write): read again until there is a number.
    for _ in range(50):
        text = (await sandboxes.sh(booted, "cat /tmp/counter 2>/dev/null || true")).strip()
        if text.isdigit():
            return int(text)
        await asyncio.sleep(0.1)
    raise AssertionError(f"no counter in the sandbox: {text!r}")


def _respec(sandboxes: SandboxFactory, spec: SandboxSpec) -> SandboxSpec:
    """A new sandbox id on a copy of the same (pristine) root, as a fork child gets."""
    fresh = sandboxes.spec(memory_mb=spec.memory_mb, cpu_count=spec.cpu_count)
    return fresh


async def test_checkpoint_then_restore_keeps_processes_files_and_envd(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    parent = await sandboxes.boot()
    await sandboxes.sh(parent, "echo kept > /tmp/written")
    await _start_via_envd(parent, COUNTER)
    await asyncio.sleep(0.5)
    before = await _counter(sandboxes, parent)
    assert "dentry_cache_limit=10" in await sandboxes.sh(parent, "cat /proc/self/mountinfo")

    image = await sandboxes.runtime.checkpoint(parent.instance, tmp_path / "img",
                                               leave_running=True)
    assert all((image.path / name).exists() for name in IMAGE_FILES)
    assert image.size_bytes > 1_000_000
    # The source runs on.
    assert await sandboxes.health(parent) == 204
    assert await _counter(sandboxes, parent) >= before

    spec = _respec(sandboxes, parent.spec)
    slot = await sandboxes.pool.acquire()
    child = sandboxes.track(await sandboxes.runtime.restore(image, spec, slot), spec)
    await sandboxes.envd_ready(child, timeout=30)
    # The written file lives in the in-memory root layer, so it came with the image.
    assert (await sandboxes.sh(child, "cat /tmp/written")).strip() == "kept"
    first = await _counter(sandboxes, child)
    await asyncio.sleep(0.5)
    assert await _counter(sandboxes, child) > first >= before
    # Independent afterwards: the child's writes do not reach the parent.
    await sandboxes.sh(child, "echo child > /tmp/written")
    assert (await sandboxes.sh(parent, "cat /tmp/written")).strip() == "kept"


async def test_checkpoint_without_leave_running_stops_the_sandbox(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    booted = await sandboxes.boot()
    await _start_via_envd(booted, COUNTER)
    await sandboxes.runtime.checkpoint(booted.instance, tmp_path / "img", leave_running=False)
    assert await sandboxes.health(booted) == 0  # saved and gone (runsc's state file lags)
    await sandboxes.destroy(booted)
    # Restore under the same id into a new slot: the paused sandbox comes back.
    slot = await sandboxes.pool.acquire()
    again = sandboxes.track(
        await sandboxes.runtime.restore(MemoryImage.at(tmp_path / "img"), booted.spec, slot),
        booted.spec,
    )
    await sandboxes.envd_ready(again, timeout=30)
    first = await _counter(sandboxes, again)
    await asyncio.sleep(0.4)
    assert await _counter(sandboxes, again) > first


async def test_freeze_stops_the_guest_and_thaw_continues_it(sandboxes: SandboxFactory) -> None:
    booted = await sandboxes.boot()
    await _start_via_envd(booted, COUNTER)
    await asyncio.sleep(0.3)
    await sandboxes.runtime.freeze(booted.instance)
    assert await sandboxes.health(booted) == 0
    await sandboxes.runtime.thaw(booted.instance)
    first = await _counter(sandboxes, booted)
    await asyncio.sleep(0.4)
    assert await _counter(sandboxes, booted) > first


async def _observed_status(sandboxes: SandboxFactory, booted: Booted) -> str:
    [mine] = [o for o in await sandboxes.runtime.observe()
              if o.sandbox_id == booted.instance.sandbox_id]
    return mine.status


async def test_freeze_state_is_the_drivers_pause_marker(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    """Freeze/thaw go over the control socket, which runsc's state file does not see: the
    driver's marker is what ``observe`` reports, and a marker left mid-call is "in-doubt",
    which the driver refuses to thaw (a resume of a running sentry kills it)."""
    runtime = sandboxes.runtime
    assert isinstance(runtime, GvisorRuntime)
    booted = await sandboxes.boot()
    marker = runtime.sandbox_dir(booted.instance.sandbox_id) / "pause-state"
    await runtime.freeze(booted.instance)
    assert marker.read_text() == "frozen"
    assert (await runtime.runsc.state(booted.instance.runtime_id)).status == "running"
    assert await _observed_status(sandboxes, booted) == "paused"
    await runtime.thaw(booted.instance)
    assert not marker.exists()
    assert await _observed_status(sandboxes, booted) == "running"

    marker.write_text("freezing")  # as a crash between the marker and the Pause call leaves it
    assert await _observed_status(sandboxes, booted) == "in-doubt"
    with pytest.raises(InDoubt):
        await runtime.thaw(booted.instance)
    with pytest.raises(InDoubt):
        await runtime.freeze(booted.instance)
    assert await sandboxes.health(booted) == 204  # never resumed while running: still alive
    # A checkpoint settles it either way (what recovery does with an in-doubt sandbox).
    image = await runtime.checkpoint(booted.instance, tmp_path / "img", leave_running=False)
    assert image.size_bytes > 0
    shutil.rmtree(tmp_path, ignore_errors=True)


async def test_a_failed_checkpoint_removes_its_directory(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    booted = await sandboxes.boot()
    await sandboxes.destroy(booted)
    with pytest.raises((NotFound, RuntimeFailure)):
        await sandboxes.runtime.checkpoint(booted.instance, tmp_path / "img",
                                           leave_running=True)
    assert not (tmp_path / "img").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


async def test_restore_answers_after_a_checkpoint_with_an_open_connection(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    """Under uvloop, such a restore often got an envd that never answered; the restore-safe
    selector (envd/eventloop.py) fixed it. The node still quiesces connections before every
    checkpoint (a save can also panic on a half-open endpoint)."""
    parent = await sandboxes.boot()
    base = f"http://{parent.slot.guest_ip}:{ENVD_PORT}"
    async with httpx.AsyncClient(transport=guest_http.transport(parent.slot),
                                 base_url=base) as client:
        assert (await client.get("/health")).status_code == 204  # keep-alive stays open
        image = await sandboxes.runtime.checkpoint(parent.instance, tmp_path / "img",
                                                   leave_running=True)
        spec = sandboxes.spec()
        slot = await sandboxes.pool.acquire()
        child = sandboxes.track(await sandboxes.runtime.restore(image, spec, slot), spec)
        await sandboxes.envd_ready(child, timeout=10)
        assert await sandboxes.health(parent) == 204


async def test_restore_answers_after_the_host_closed_its_connections(
    sandboxes: SandboxFactory, tmp_path: Path
) -> None:
    parent = await sandboxes.boot()
    base = f"http://{parent.slot.guest_ip}:{ENVD_PORT}"
    async with httpx.AsyncClient(transport=guest_http.transport(parent.slot),
                                 base_url=base) as client:
        assert (await client.get("/health")).status_code == 204
    await asyncio.sleep(0.05)
    image = await sandboxes.runtime.checkpoint(parent.instance, tmp_path / "img",
                                               leave_running=True)
    spec = sandboxes.spec()
    slot = await sandboxes.pool.acquire()
    child = sandboxes.track(await sandboxes.runtime.restore(image, spec, slot), spec)
    await sandboxes.envd_ready(child, timeout=15)
    assert await sandboxes.health(parent) == 204
