"""Disk workspaces (``workspace = "disk"``): written files on a disk image of the sandbox's own.

- a 512 MiB sandbox writes 2 GiB of files and survives a pause/resume with them, while its
  runtime's memory stays near an idle sandbox's;
- a write past ``disk_size_mb`` fails with ENOSPC inside the sandbox, which lives on;
- a filesystem-only pause (``memory: false``) keeps the files, drops the processes, and the
  resume is a new boot; ``pauseMode`` says which;
- fork x4 of that sandbox: every child has the 2 GiB (clones of the parent's disk, sharing
  its blocks), and the children's and the parent's writes stay apart;
- a snapshot of it reads only the chunks changed since the previous one (10 MiB of 2 GiB),
  and a sandbox created from it has the files;
- a kill leaves no disk image, loop device or mount behind;
- sandboxes of the base template and of a template built with a start and a ready command are
  restored from the template's memory image onto clones of its disk: the start command runs
  on, the build's files are there, each sandbox's writes stay its own.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template

from tests.server.harness import API_KEY, NodeServer, serving

pytestmark = [pytest.mark.gvisor, pytest.mark.slow, pytest.mark.timeout(900)]

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@pytest.fixture(scope="module")
def disk_node() -> Iterator[NodeServer]:
    # Files 4x the sandbox's memory; sizes halved from 4 GiB in 1 GiB to keep the suite short.
    with serving(workspace="disk", disk_size_mb="2560", default_memory_mb="512",
                 workspace_pool_bytes=str(40 << 30), warm_pool_size="0") as node:
        yield node


def _raw(node: NodeServer, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, f"{node.url}{path}", headers={"X-API-KEY": API_KEY},
                         timeout=120, **kw)  # type: ignore[arg-type]


def _loop_devices_of(node: NodeServer) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if str(node.home) in backing.read_text():
            found.append(backing.parent.parent.name)
    return found


def _sandbox_pss_mb(node: NodeServer, sandbox_id: str) -> float:
    """PSS of the sandbox's runsc processes (the sentry holds guest memory)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if sandbox_id.encode() not in cmdline or b"runsc" not in cmdline:
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def test_2_gib_of_files_in_a_512_mib_sandbox_survive_a_pause(disk_node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=900)
    idle = _sandbox_pss_mb(disk_node, sbx.sandbox_id)
    sbx.commands.run("for i in 1 2 3 4; do dd if=/dev/urandom of=$HOME/f$i bs=4M count=128 "
                     "iflag=fullblock status=none; done",
                     timeout=600)
    sums = sbx.commands.run("tail -c 1048576 ~/f4 | md5sum; ls -l ~ | wc -l").stdout
    df = sbx.commands.run("df -m / | tail -1").stdout.split()
    assert int(df[2]) >= 2048, df  # used MiB on the sandbox's own disk
    busy = _sandbox_pss_mb(disk_node, sbx.sandbox_id)
    assert busy < idle + 256, (idle, busy)  # the files are not in the sandbox's memory
    sbx.pause()
    sbx = Sandbox.connect(sbx.sandbox_id, timeout=900)
    assert sbx.commands.run("tail -c 1048576 ~/f4 | md5sum; ls -l ~ | wc -l").stdout == sums
    # Fork x4: each child starts on a clone of the parent's disk at the fork instant.
    pool = disk_node.home / "workspaces"
    before = shutil.disk_usage(pool).used
    response = _raw(disk_node, "POST", f"/sandboxes/{sbx.sandbox_id}/fork", json={"count": 4})
    assert response.status_code == 201, response.text
    assert all("sandbox" in entry for entry in response.json()), response.json()
    children = [entry["sandbox"]["sandboxID"] for entry in response.json()]
    assert len(children) == 4
    assert shutil.disk_usage(pool).used - before < 256 << 20  # clones share the 2 GiB
    sbx.commands.run("echo parent > ~/who")
    for n, child_id in enumerate(children):
        child = Sandbox.connect(child_id, timeout=900)
        check = "tail -c 1048576 ~/f4 | md5sum; ls -l ~ | wc -l"
        assert child.commands.run(check).stdout == sums, child_id
        assert child.commands.run(f"echo child{n} > ~/who && cat ~/who").stdout.strip() == \
            f"child{n}"
        child.kill()
    assert sbx.commands.run("cat ~/who").stdout.strip() == "parent"

    # Snapshots: the first reads the whole disk, the next one only what changed (10 MiB).
    first = sbx.create_snapshot()
    sbx.commands.run("head -c 10485760 /dev/urandom | dd of=$HOME/f2 bs=1M seek=100 "
                     "conv=notrunc status=none && sync")
    changed = sbx.commands.run("tail -c 1048576 ~/f4 | md5sum; md5sum ~/who; "
                               "dd if=$HOME/f2 bs=1M skip=100 count=10 status=none | md5sum"
                               ).stdout
    second = sbx.create_snapshot()
    read, unchanged = _chunk_counts(disk_node, second.snapshot_id)
    assert read <= 16 and unchanged >= 500, (read, unchanged)  # 4 MiB chunks of ~2 GiB
    child = Sandbox.create(second.snapshot_id, timeout=900)
    assert child.commands.run("tail -c 1048576 ~/f4 | md5sum; md5sum ~/who; "
                              "dd if=$HOME/f2 bs=1M skip=100 count=10 status=none | md5sum"
                              ).stdout == changed
    child.kill()
    assert first.snapshot_id != second.snapshot_id
    sbx.kill()


def test_a_write_past_the_disk_size_is_enospc_and_the_sandbox_lives(
    disk_node: NodeServer,
) -> None:
    sbx = Sandbox.create(timeout=600)
    result = sbx.commands.run(
        "dd if=/dev/zero of=$HOME/too-big bs=4M count=750 status=none; echo rc=$?", timeout=600)
    assert "No space left on device" in result.stderr, result.stderr
    assert "rc=1" in result.stdout
    sbx.commands.run("rm ~/too-big")
    assert sbx.commands.run("echo alive > ~/after && cat ~/after").stdout.strip() == "alive"
    sbx.kill()


def test_a_filesystem_only_pause_keeps_files_and_boots_fresh(disk_node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=600)
    sbx.files.write("/home/user/kept.txt", "kept")
    boot_before = sbx.commands.run(BOOT_ID).stdout
    sbx.commands.run("sleep 3600", background=True)
    response = _raw(disk_node, "POST", f"/sandboxes/{sbx.sandbox_id}/pause",
                    json={"memory": False})
    assert response.status_code == 204, response.text
    info = _raw(disk_node, "GET", f"/sandboxes/{sbx.sandbox_id}").json()
    assert (info["state"], info["pauseMode"]) == ("paused", "filesystem")
    assert not sbx.is_running()
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=600)
    assert resumed.files.read("/home/user/kept.txt") == "kept"
    assert resumed.commands.run(BOOT_ID).stdout != boot_before
    assert "sleep 3600" not in resumed.commands.run("ps -eo args").stdout
    resumed.kill()


def _chunk_counts(node: NodeServer, snapshot_id: str) -> tuple[int, int]:
    """The export's counts: it runs after the snapshot's answer, in the commit."""
    pattern = rf"for snapshot {snapshot_id}: (\d+) chunks read, (\d+) unchanged"
    deadline = time.monotonic() + 120
    while not (found := re.search(pattern, node.log())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found, node.log()[-2000:]
    return int(found[1]), int(found[2])


def test_a_kill_leaves_no_disk_image_behind(disk_node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=300)
    image = disk_node.home / "workspaces" / f"{sbx.sandbox_id}.img"
    assert image.exists()
    sbx.kill()
    deadline = time.monotonic() + 10
    while image.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not image.exists()
    mounts = Path("/proc/self/mounts").read_text()
    assert f"workspaces-mnt/{sbx.sandbox_id}" not in mounts
    # Only the pool's own loop device (if it is an image) is left, once the kernel has let go
    # of the sandbox's: a device released at its unmount (autoclear) goes at its last close,
    # which the kernel may do after the unmount returned and the image was removed.
    while len(_loop_devices_of(disk_node)) > 1 and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    assert len(_loop_devices_of(disk_node)) <= 1, _loop_devices_of(disk_node)


def _create_phases(node: NodeServer, sandbox_id: str) -> str:
    found = re.search(rf"created {sandbox_id} \(\w+\) in \d+ ms: (.*)", node.log())
    assert found, node.log()[-2000:]
    return found[1]


def test_templates_restore_onto_clones_of_their_disk(disk_node: NodeServer) -> None:
    base = Sandbox.create(timeout=300)
    assert "restore" in _create_phases(disk_node, base.sandbox_id)
    base.kill()

    name = f"disk-start-{time.time_ns()}"
    template = (
        Template().from_template("base")
        .run_cmd("echo built > ~/built.txt")
        .set_start_cmd("while true; do date +%s%N > /tmp/a.new; mv /tmp/a.new ~/alive; "
                       "sleep 0.5; done", "test -s ~/alive")
    )
    logs: list[str] = []
    Template.build(template, name, on_build_logs=lambda e: logs.append(e.message))
    assert any("memory image taken" in line and "with its disk" in line for line in logs), logs
    first, second = Sandbox.create(name, timeout=300), Sandbox.create(name, timeout=300)
    try:
        for sbx in (first, second):
            assert "restore" in _create_phases(disk_node, sbx.sandbox_id)
            assert sbx.files.read("/home/user/built.txt") == "built\n"
            # The start command was running when the image was taken: it still runs.
            before = sbx.files.read("/home/user/alive")
            time.sleep(1.2)
            assert sbx.files.read("/home/user/alive") != before
            assert (disk_node.home / "workspaces" / f"{sbx.sandbox_id}.img").exists()
        first.files.write("/home/user/mine.txt", "first")
        assert not second.files.exists("/home/user/mine.txt")
    finally:
        first.kill()
        second.kill()


def test_a_create_from_a_snapshot_just_answered_does_not_wait_for_its_commit(
        disk_node: NodeServer) -> None:
    """The snapshot's disk export (1 GiB changed: seconds of reading) and its commit run
    after the answer; a create from it here restores from the staged image and the local
    clone of the disk at once, with the files the snapshot holds."""
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.commands.run("head -c 1073741824 /dev/urandom > ~/big && md5sum ~/big > ~/big.md5 "
                         "&& sync", timeout=300)
        snapshot = sbx.create_snapshot()
        child = Sandbox.create(snapshot.snapshot_id, timeout=300)
        log = disk_node.log()
        created = log.find(f"created {child.sandbox_id} ")
        committed = log.find(f"committed snapshot {snapshot.snapshot_id} ")
        assert created != -1, log[-2000:]
        assert committed == -1 or created < committed, log[-3000:]
        assert child.commands.run("md5sum -c ~/big.md5").stdout.strip().endswith("OK")
        child.kill()
        # Committed after all, with the chunks of the whole gigabyte.
        read, _ = _chunk_counts(disk_node, snapshot.snapshot_id)
        assert read >= 256, read
        assert snapshot.snapshot_id in [s.snapshot_id for s in Sandbox.list_snapshots()
                                        .next_items()]
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        sbx.kill()


def test_gc_removes_disk_clones_a_crash_left(disk_node: NodeServer) -> None:
    """A disk clone older than ``gc_grace_s`` that no pending export names was left by a
    crash (mid-snapshot, mid-fork): a GC pass removes it; a sandbox's previous export (its
    pin) and a fresh clone stay."""
    clones = disk_node.home / "workspaces" / "clones"
    clones.mkdir(exist_ok=True)
    old, fresh, pin = (clones / "snapleft.abc.img", clones / "snapnew.abc.img",
                       clones / "someonesandbox000000.last.img")
    two_hours_ago = time.time() - 7200
    for path in (old, fresh, pin):
        path.write_bytes(b"\0" * 4096)
    for path in (old, pin):
        os.utime(path, (two_hours_ago, two_hours_ago))
    try:
        response = _raw(disk_node, "POST", "/repository/gc")
        assert response.status_code == 200, response.text
        assert not old.exists()
        assert fresh.exists() and pin.exists()
        assert "a disk clone a crash left" in disk_node.log()
    finally:
        for path in (old, fresh, pin):
            path.unlink(missing_ok=True)
