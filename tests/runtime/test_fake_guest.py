"""The fake runtime's guests (runtime/fake_guest.py) in real network slots, reached as a node
reaches a real guest: through the slot's host veth.

Boot → envd's control endpoints answer (``/health``, ``/init`` with envd's token rules,
``/metrics``, a ``Process/Start`` that says no command runs); freeze → silence, thaw →
answers; a checkpoint that ends the sandbox stops its guest, and a restore in another slot
answers ``/restored`` and keeps the token its image holds; destroy leaves nothing listening
and no thread or namespace of ours behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from aenv.core import ids
from aenv.core.errors import RuntimeFailure
from aenv.core.net import NetSlot
from aenv.network import guest_http, slots
from aenv.network.pool import SlotPool
from aenv.orchestrator.envd_process import EnvdProcesses
from aenv.runtime.base import ENVD_PORT, Instance, SandboxSpec
from aenv.runtime.fake import FakeRuntime
from aenv.runtime.fake_guest import BOOT_ID, NO_COMMAND_STATUS, TOKEN

pytestmark = pytest.mark.anyio


@pytest.fixture
async def runtime() -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(guest=True)
    try:
        yield runtime
    finally:
        for observed in await runtime.observe():
            await runtime.destroy(Instance(observed.sandbox_id, observed.runtime_id,
                                           observed.pid, None))


def _spec(tmp_path: Path) -> SandboxSpec:
    sid = ids.new_sandbox_id()
    (tmp_path / sid).mkdir()
    return SandboxSpec(sid, tmp_path / sid, tmp_path, cpu_count=1, memory_mb=256)


def _client(slot: NetSlot, timeout: float = 2.0) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=guest_http.transport(slot),
                             base_url=f"http://{slot.guest_ip}:{ENVD_PORT}", timeout=timeout)


async def _init(slot: NetSlot, token: str, *, as_token: str | None = None,
                renew: bool = False) -> int:
    async with _client(slot) as client:
        response = await client.post(
            "/init", json={"accessToken": token, "envVars": {"A": "1"}, "renewBootId": renew},
            headers={"X-Access-Token": as_token or token})
        return response.status_code


async def test_a_guest_answers_envd_control_endpoints_in_its_slot(
    runtime: FakeRuntime, pool: SlotPool, tmp_path: Path
) -> None:
    slot = await pool.acquire()
    spec = _spec(tmp_path)
    instance = await runtime.boot(spec, slot)
    async with _client(slot) as client:
        assert (await client.get("/health")).status_code == 204
        assert (await client.post("/restored")).status_code == 204
    assert runtime.recall(spec.sandbox_id).get(BOOT_ID)
    assert await _init(slot, "t1") == 204
    assert runtime.recall(spec.sandbox_id)[TOKEN] == "t1"
    # envd's rules: the holder of the token (or its new value) may change it; others not.
    assert await _init(slot, "t2", as_token="wrong") == 401
    async with _client(slot) as client:
        assert (await client.get("/metrics")).status_code == 401
        metrics = (await client.get("/metrics", headers={"X-Access-Token": "t1"})).json()
        assert metrics["cpu_count"] == 1 and metrics["mem_total"] == 256 << 20
        assert (await client.get("/envs", headers={"X-Access-Token": "t1"})).json() == {
            "A": "1"}
        assert (await client.get("/files", params={"path": "/x"})).status_code == 501
        assert (await client.get("/nowhere", headers={"X-Access-Token": "t1"})
                ).status_code == 404
    # The node's warm-up command path: a process that could not run, said so.
    async with EnvdProcesses(guest_http.transport(slot), slot, "t1") as processes:
        out: list[str] = []
        end = await processes.run("/bin/bash", ["-l", "-c", "true"], user="root",
                                  on_output=lambda _, text: out.append(text))
    assert end.exit_code == NO_COMMAND_STATUS and "no commands" in "".join(out)

    await runtime.destroy(instance)
    with pytest.raises(httpx.ConnectError):
        async with _client(slot) as client:
            await client.get("/health")
    await pool.release(slot)


async def test_a_frozen_guest_is_silent_until_thawed(
    runtime: FakeRuntime, pool: SlotPool, tmp_path: Path
) -> None:
    slot = await pool.acquire()
    instance = await runtime.boot(_spec(tmp_path), slot)
    await runtime.freeze(instance)
    async with _client(slot, timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/health")
    await runtime.thaw(instance)
    async with _client(slot) as client:
        assert (await client.get("/health")).status_code == 204
    await runtime.destroy(instance)
    await pool.release(slot)


async def test_a_restored_guest_answers_as_a_booted_one_with_its_saved_identity(
    runtime: FakeRuntime, pool: SlotPool, tmp_path: Path
) -> None:
    """As a spill and a resume: the image keeps envd's token and boot id; the restore, in
    another slot (or a pre-created sandbox), answers ``/restored`` and takes an ``/init``
    authorised by that token."""
    first = await pool.acquire()
    spec = _spec(tmp_path)
    source = await runtime.boot(spec, first)
    assert await _init(first, "parent") == 204
    boot_id = runtime.recall(spec.sandbox_id)[BOOT_ID]
    image = await runtime.checkpoint(source, tmp_path / "img", leave_running=False)
    with pytest.raises(httpx.ConnectError):  # the sandbox exited: nothing listens
        async with _client(first) as client:
            await client.get("/health")
    await runtime.destroy(source)
    await pool.release(first)

    second = await pool.acquire()
    child = await runtime.restore(image, _spec(tmp_path), second)
    async with _client(second) as client:
        assert (await client.post("/restored")).status_code == 204
    assert runtime.recall(child.sandbox_id)[BOOT_ID] == boot_id
    assert await _init(second, "child") == 401  # not authorised by the saved token
    assert await _init(second, "child", as_token="parent", renew=True) == 204
    assert runtime.recall(child.sandbox_id)[BOOT_ID] != boot_id

    pre_slot = await pool.acquire()
    pre = await runtime.precreate(_spec(tmp_path), pre_slot)
    with pytest.raises(httpx.ConnectError):  # created, not started: nothing listens yet
        async with _client(pre_slot) as client:
            await client.get("/health")
    resumed = await runtime.restore_precreated(pre, image, sandbox_id=spec.sandbox_id)
    async with _client(pre_slot) as client:
        assert (await client.post("/restored")).status_code == 204
    assert runtime.recall(resumed.sandbox_id)[TOKEN] == "parent"
    for instance, slot in ((child, second), (resumed, pre_slot)):
        await runtime.destroy(instance)
        await pool.release(slot)


async def test_a_slot_without_a_netns_fails_the_boot_and_leaves_nothing(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    assert not slots.exists(61_998)
    with pytest.raises(RuntimeFailure):
        await runtime.boot(_spec(tmp_path), slots.slot_for(61_998))
    assert await runtime.observe() == []
    await asyncio.sleep(0.05)
    # The thread that went to enter the netns has ended.
    assert not [t for t in threading.enumerate() if t.name == "aenv-fake-guest"]
