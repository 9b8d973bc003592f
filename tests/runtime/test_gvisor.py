"""The gVisor driver on the real runsc: envd reachable, isolation, egress, limits, recovery."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from aenv.network import guest_http, nft
from aenv.runtime.base import ENVD_PORT, Instance
from aenv.runtime.gvisor import GvisorRuntime
from tests.network.peers import (
    ECHO_PORT,
    HOLD,
    PROBE,
    HostListener,
    InternetPeer,
    host_primary_ip,
    wait_gone,
)
from tests.runtime.conftest import (
    CGROUP_PARENT,
    CGROUP_ROOT,
    REPO,
    SandboxFactory,
    gvisor_config,
    leftovers,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.anyio]

PROBE_TIMEOUT_S = 1.5


async def test_envd_answers_through_the_slot(sandboxes: SandboxFactory) -> None:
    sbx = await sandboxes.boot()
    async with httpx.AsyncClient(
        transport=guest_http.transport(sbx.slot),
        base_url=f"http://{sbx.slot.guest_ip}:{ENVD_PORT}",
    ) as client:
        assert (await client.get("/health")).status_code == 204
    observed = {o.sandbox_id: o for o in await sandboxes.runtime.observe()}
    assert observed[sbx.id].status == "running"
    assert observed[sbx.id].pid == sbx.instance.pid
    # The guest runs as configured: its hostname, its memory, envd as PID 1.
    out = await sandboxes.sh(sbx, "hostname; grep MemTotal /proc/meminfo; cat /proc/1/cmdline")
    hostname, meminfo, cmdline = out.split("\n", 2)
    assert hostname == "sandbox"
    assert int(meminfo.split()[1]) == 256 * 1024
    assert cmdline.startswith("/opt/aenv/envd/") and "aenv.envd" in cmdline  # launcher exec
    stats = await sandboxes.runtime.stats(sbx.instance)
    assert stats.cpu_count == 1 and stats.mem_total == 256 * 1024 * 1024
    assert 0 < stats.mem_used < stats.mem_total and 0.0 <= stats.cpu_used_pct <= 100.0


async def test_two_sandboxes_are_reachable_at_once(sandboxes: SandboxFactory) -> None:
    a, b = await asyncio.gather(
        *(sandboxes.boot(files={"/www/id.txt": name}) for name in ("first", "second"))
    )
    for sbx in (a, b):
        await sandboxes.sh(sbx, "httpd -p 8080 -h /www")  # busybox httpd daemonizes
    for sbx, name in ((a, "first"), (b, "second")):
        await guest_http.wait_http(sbx.slot, 8080, "/id.txt", timeout=10, expect=200)
        async with httpx.AsyncClient(
            transport=guest_http.transport(sbx.slot), base_url=f"http://{sbx.slot.guest_ip}:8080"
        ) as client:
            assert (await client.get("/id.txt")).text == name
        assert await sandboxes.health(sbx) == 204


async def test_a_sandbox_reaches_neither_the_host_nor_its_neighbour(
    sandboxes: SandboxFactory, internet: InternetPeer
) -> None:
    a, b = await asyncio.gather(sandboxes.boot(), sandboxes.boot())
    listener = HostListener()
    try:
        port = listener.port
        blocked = [
            f"{a.slot.gateway_ip}:{port}",  # the host end of its own veth
            f"{host_primary_ip()}:{port}",  # the host's address on its default route
            f"{internet.host_ip}:{port}",  # any other host address
            f"{sandboxes.pool.return_ip(b.slot)}:{port}",  # the neighbour's return address
            f"{sandboxes.pool.return_ip(b.slot)}:{ENVD_PORT}",
            f"{a.slot.gateway_ip}:{ENVD_PORT}",
        ]
        out = await sandboxes.py(
            a, PROBE, str(PROBE_TIMEOUT_S), *blocked, f"127.0.0.1:{port}",
            f"{internet.ip}:{ECHO_PORT}",
        )
        result = json.loads(out)
        assert result.pop(f"{internet.ip}:{ECHO_PORT}") == "connected"
        # Its own loopback: nothing listens there (and it is not the host's).
        assert result.pop(f"127.0.0.1:{port}") == "ConnectionRefusedError"
        assert result == dict.fromkeys(blocked, "timeout")
        assert listener.accepted() == 0
        assert await sandboxes.health(b) == 204
    finally:
        listener.close()


async def test_two_sandboxes_hold_the_same_connection_tuple_at_once(
    sandboxes: SandboxFactory, internet: InternetPeer
) -> None:
    """Egress NAT with conntrack zones: same source IP and port, same destination."""
    a, b = await asyncio.gather(sandboxes.boot(), sandboxes.boot())
    outs = await asyncio.gather(
        *(
            sandboxes.py(s, HOLD, "40000", internet.ip, str(ECHO_PORT), "1.0", s.id)
            for s in (a, b)
        )
    )
    results = [json.loads(out) for out in outs]
    for result, sbx in zip(results, (a, b), strict=True):
        assert result["greeting"].startswith(f"peer {internet.host_ip}:")
        assert result["echo"] == f"echo {sbx.id}"
    assert results[0]["greeting"] != results[1]["greeting"]


HOG = r"""
import sys
chunks = []
try:
    for i in range(64):
        chunks.append(bytearray(16 * 1024 * 1024))
        for j in range(0, len(chunks[-1]), 4096):
            chunks[-1][j] = 1
        print((i + 1) * 16, flush=True)
except MemoryError:
    print("MemoryError", flush=True)
    sys.exit(3)
"""


async def test_a_memory_hog_meets_the_limit_and_the_neighbour_carries_on(
    sandboxes: SandboxFactory,
) -> None:
    hog, neighbour = await asyncio.gather(sandboxes.boot(memory_mb=128), sandboxes.boot())
    done = await sandboxes.runtime.runsc.exec(
        hog.id, _python_argv(sandboxes, HOG), env={"PYTHONHOME": "/opt/aenv/envd"},
        check=False, timeout=120,
    )
    reached = [int(line) for line in done.text.split() if line.isdigit()]
    assert done.returncode != 0 and max(reached, default=0) < 128, done.text
    assert await sandboxes.health(neighbour) == 204
    cgroup = CGROUP_ROOT / "memory" / CGROUP_PARENT.strip("/") / hog.id
    kills = int((cgroup / "memory.oom_control").read_text().split("oom_kill ")[1].split()[0])
    assert kills >= 1, "the hog was stopped by something other than its cgroup's OOM killer"
    # Often the OOM killer takes only the hog's stub and the sandbox lives on; but the hog's
    # pages are freed only once the sentry notices, so a second OOM may take the sentry too
    # (runtime/oci.py). Either way the limit held and the neighbour carried on.
    if await sandboxes.health(hog) == 204:
        assert kills == 1


async def test_a_fork_bomb_leaves_the_neighbour_answering(sandboxes: SandboxFactory) -> None:
    # 1 GiB: room for the sentry's per-process memory up to RLIMIT_NPROC (~800 host tasks).
    bomb, neighbour = await asyncio.gather(sandboxes.boot(memory_mb=1024), sandboxes.boot())
    # As a user, RLIMIT_NPROC stops the bomb inside the sandbox: fork fails with EAGAIN, the
    # sandbox stays up and envd answers again once the burst is over.
    await sandboxes.sh(bomb, "(f(){ f | f & }; f) >/dev/null 2>&1 </dev/null &", user="1000:1000")
    for _ in range(5):
        await asyncio.sleep(1)
        assert await sandboxes.health(neighbour) == 204
    await sandboxes.envd_ready(bomb, timeout=30)
    assert [o.status for o in await sandboxes.runtime.observe() if o.sandbox_id == bomb.id] == [
        "running"
    ]
    await sandboxes.destroy(bomb)
    # As root (not bound by RLIMIT_NPROC) the host's pids and memory limits stop it, and may
    # take the sandbox down with it; the neighbour does not notice.
    bomb = await sandboxes.boot()
    await sandboxes.sh(bomb, "(f(){ f | f & }; f) >/dev/null 2>&1 </dev/null &")
    for _ in range(6):
        await asyncio.sleep(1)
        assert await sandboxes.health(neighbour) == 204
    pids = CGROUP_ROOT / "pids" / CGROUP_PARENT.strip("/") / bomb.id
    if pids.exists():
        assert int((pids / "pids.current").read_text()) <= sandboxes.runtime.config.limits.pids


async def test_destroy_leaves_nothing_behind(sandboxes: SandboxFactory) -> None:
    sbx = await sandboxes.boot()
    runtime, slot = sandboxes.runtime, sbx.slot
    await sandboxes.destroy(sbx)
    assert await runtime.runsc.list() == []
    assert await runtime.observe() == []
    assert leftovers(runtime, [sbx.id]) == []
    assert not runtime.sandbox_dir(sbx.id).exists() or not any(
        p.name in ("bundle",) for p in runtime.sandbox_dir(sbx.id).iterdir()
    )
    assert not Path(f"/sys/class/net/{slot.host_ifname}").exists()
    assert wait_gone(Path(slot.netns_path))
    table = await nft.read_table()
    assert table is None or slot.index not in set(table.slots) | table.chains
    await runtime.destroy(sbx.instance)  # idempotent



async def test_destroy_ends_a_sandbox_whose_runsc_state_file_was_cut_short(
        sandboxes: SandboxFactory) -> None:
    """A node killed while runsc rewrote a state file leaves it empty: every ``runsc delete``
    then fails ("unexpected end of JSON input"), and the long torture found the sandbox's
    processes outliving the node. The delete ends it without runsc instead."""
    from aenv.runtime.gvisor_teardown import state_file

    sbx = await sandboxes.boot()
    runtime = sandboxes.runtime
    state = state_file(runtime.config.state_dir, sbx.instance.runtime_id)
    assert state.is_file()
    state.write_bytes(b"")
    await sandboxes.destroy(sbx)
    assert not state.exists()
    assert await runtime.runsc.list() == []
    assert leftovers(runtime, [sbx.id]) == []


BOOT_IN_CHILD = r"""
import asyncio, dataclasses, json, pathlib, sys
from aenv.network import slots
from aenv.runtime.base import SandboxSpec
from aenv.runtime.gvisor import GvisorConfig, GvisorRuntime
args = json.loads(sys.argv[1])
runtime = GvisorRuntime(GvisorConfig(state_dir=pathlib.Path(args["state_dir"]),
                                     cgroup_parent=args["cgroup_parent"], keep_logs=True))
spec = SandboxSpec(sandbox_id=args["id"], rootfs=pathlib.Path(args["rootfs"]),
                   envd_bundle=pathlib.Path(args["bundle"]), cpu_count=1, memory_mb=256)
instance = asyncio.run(runtime.boot(spec, slots.slot_for(args["slot"])))
print(json.dumps({"pid": instance.pid}), flush=True)
import time
time.sleep(3600)
"""


async def test_a_sandbox_survives_the_death_of_the_process_that_booted_it(
    sandboxes: SandboxFactory,
) -> None:
    spec = sandboxes.spec()
    slot = await sandboxes.pool.acquire()
    config = sandboxes.runtime.config
    args = {
        "state_dir": str(config.state_dir), "cgroup_parent": config.cgroup_parent,
        "id": spec.sandbox_id, "rootfs": str(spec.rootfs), "bundle": str(spec.envd_bundle),
        "slot": slot.index,
    }
    child = subprocess.Popen(
        [sys.executable, "-c", BOOT_IN_CHILD, json.dumps(args)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        pid = json.loads(line)["pid"]
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # A new driver (a restarted server) finds it running, and it still answers.
    fresh = GvisorRuntime(gvisor_config(config.state_dir.parent))
    observed = {o.sandbox_id: o for o in await fresh.observe()}
    assert observed[spec.sandbox_id].status == "running"
    assert observed[spec.sandbox_id].pid == pid
    booted = sandboxes.track(Instance(spec.sandbox_id, spec.sandbox_id, pid, slot), spec)
    await sandboxes.envd_ready(booted)
    assert os.getsid(pid) == pid  # its own session: no signal to our group reaches it


async def test_boot_to_envd_health_time(sandboxes: SandboxFactory) -> None:
    """boot() → envd /health answering, three times in a row, p50 printed (also the idle
    footprint). Timings belong to the benchmarks (``bench.node_bench``): three boots, not
    ten, keep this check inside the suite's 30 minutes."""
    boots, readies = [], []
    for _ in range(3):
        spec = sandboxes.spec()
        slot = await sandboxes.pool.acquire()
        started = time.perf_counter()
        instance = await sandboxes.runtime.boot(spec, slot)
        booted_at = time.perf_counter()
        booted = sandboxes.track(instance, spec)
        await sandboxes.envd_ready(booted)
        readies.append(time.perf_counter() - started)
        boots.append(booted_at - started)
        if len(sandboxes.booted) > 2:
            await sandboxes.destroy(sandboxes.booted[0])
    await asyncio.sleep(2)  # idle
    pss = _pss_kb(sandboxes.booted[-1].id)
    cgroup = CGROUP_ROOT / "memory" / CGROUP_PARENT.strip("/") / sandboxes.booted[-1].id
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    print(
        f"\nboot (runsc run) p50 {statistics.median(boots) * 1000:.0f} ms; "
        f"boot → envd /health p50 {statistics.median(readies) * 1000:.0f} ms "
        f"(min {min(readies) * 1000:.0f}, max {max(readies) * 1000:.0f}); "
        f"idle sandbox: PSS {pss / 1024:.1f} MiB (sandbox + gofer + stubs, shared address "
        f"spaces counted once), memory cgroup {usage / 2**20:.1f} MiB"
    )


def _python_argv(sandboxes: SandboxFactory, code: str) -> list[str]:
    loader = json.loads((sandboxes.envd_bundle / "manifest.json").read_text())["loader"]
    lib = "/opt/aenv/envd/lib"
    return [f"{lib}/{loader}", "--library-path", lib, f"{lib}/python3", "-S", "-c", code]


def _pss_kb(sandbox_id: str) -> int:
    """PSS of the sandbox's host processes; systrap stubs of one address space share one mm
    (identical smaps), so each distinct mm is counted once."""
    procs = CGROUP_ROOT / "memory" / CGROUP_PARENT.strip("/") / sandbox_id / "cgroup.procs"
    seen: set[tuple[str, ...]] = set()
    total = 0
    for pid in procs.read_text().split():
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            maps = tuple(Path(f"/proc/{pid}/maps").read_text().splitlines()[:4])
        except OSError:
            continue
        if maps in seen:
            continue
        seen.add(maps)
        total += sum(
            int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")
        )
    return total
