"""The host gets back the disk sandboxes freed, and a host disk above its watermark refuses
new sandboxes (issue 21, item 4).

The node's home is on a small ext4 file system of its own (a sparse image, loop-mounted), so
the host file system under its workspace pool is the test's alone: its pool is an XFS image
on it (``<home>/workspaces.xfs``), as on any host whose home cannot reflink. What the host
holds for the pool is that image's allocated size (``st_blocks``). Each test has a sandbox
write ~1 GiB of incompressible data, frees it (a delete inside, a kill, a files-only pause and
a kill) and checks that the image gives it back within a bound.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException

from aenv.storage.host_disk import RETRY_AFTER_S, disk_usage
from tests.server.harness import (
    API_KEY,
    BUNDLE,
    NodeServer,
    cleanup_home,
    client_env,
    free_port,
    kill_all_sandboxes,
    kill_leaked,
    restore_environ,
    start_server,
)

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]

#: The host file system of the node's home (sparse: costs the real host what is written).
HOST_FS_GIB = 12
#: The watermark the node runs with: far above what the tests write (~1 GiB = ~9 %).
WATERMARK = 40
WRITTEN_MIB = 1024
#: What the pool image may keep of a freed GiB: XFS log and metadata, the sandbox's own files.
SLACK = 96 << 20
#: ext4 in the sandbox's disk discards at its journal commit (5 s), the node looks for freed
#: pool blocks every second (set below), a trim takes ~0.2 s: back well within this.
BACK_WITHIN_S = 20.0


@contextlib.contextmanager
def _own_file_system() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="aenv-reclaim-") as scratch:
        image, mount_point = Path(scratch) / "host.img", Path(scratch) / "fs"
        mount_point.mkdir()
        subprocess.run(["truncate", "-s", f"{HOST_FS_GIB}G", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture(scope="module")
def node() -> Iterator[NodeServer]:
    with _own_file_system() as fs:
        home = fs / "home"
        home.mkdir()
        # Not seeded with the shared template images (copies, across file systems, of GBs):
        # the node makes its own.
        # The node hard-links the envd bundle into its home: it must be on the same file system.
        bundle = fs / "envd-bundle"
        subprocess.run(["cp", "-a", str(BUNDLE), str(bundle)], check=True)
        server = start_server(free_port(), home=home, envd_bundle=str(bundle), workspace="disk",
                              workspace_trim_interval_s="1",
                              host_disk_watermark_percent=str(WATERMARK))
        saved = {k: os.environ.get(k) for k in (*client_env(server), "E2B_DEBUG")}
        os.environ.update(client_env(server))
        os.environ.pop("E2B_DEBUG", None)
        leaked: list[int] = []
        try:
            yield server
        finally:
            try:
                with contextlib.suppress(Exception):
                    kill_all_sandboxes()
            finally:
                server.stop()
                leaked = kill_leaked(home)
                restore_environ(saved)
                if "Traceback" in server.log():
                    print("server log contains tracebacks:\n" + server.log()[-8000:])
                cleanup_home(home)
    assert not leaked, f"runsc processes outlived the server: {leaked}"


def _held(node: NodeServer) -> int:
    """Bytes the pool image takes on the host."""
    return os.stat(node.home / "workspaces.xfs").st_blocks * 512


def _write_gib(sbx: Sandbox) -> None:
    # Big blocks: every system call of the guest is trapped (ptrace platform), so a ``cat``
    # of small buffers took minutes for what dd writes in seconds.
    started = time.monotonic()
    done = sbx.commands.run(
        f"dd if=/dev/urandom of=/home/user/big bs=4M count={WRITTEN_MIB // 4} iflag=fullblock "
        "2>/dev/null && sync && stat -c %s /home/user/big", timeout=300)
    assert int(done.stdout.strip()) == WRITTEN_MIB << 20
    print(f"wrote {WRITTEN_MIB} MiB in {time.monotonic() - started:.1f} s")


def _back_within(node: NodeServer, baseline: int, bound_s: float = BACK_WITHIN_S) -> float:
    """Seconds until the pool image takes no more than ``baseline`` (+ slack) again."""
    started = time.monotonic()
    while _held(node) > baseline + SLACK and time.monotonic() - started < bound_s:
        time.sleep(0.1)
    took = time.monotonic() - started
    assert _held(node) <= baseline + SLACK, (
        f"the host still holds {(_held(node) - baseline) >> 20} MiB of the pool "
        f"{took:.1f} s after the space was freed")
    return took


def test_a_delete_inside_a_sandbox_gives_the_host_its_blocks_back(node: NodeServer) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        baseline = _held(node)
        _write_gib(sbx)
        assert _held(node) > baseline + (WRITTEN_MIB << 20) * 9 // 10
        sbx.commands.run("rm /home/user/big && sync")
        took = _back_within(node, baseline)
        print(f"a delete inside: back in {took:.1f} s")
        # The disk still takes writes where the freed blocks were.
        sbx.commands.run("dd if=/dev/urandom of=/home/user/again bs=4M count=16 && sync")
    finally:
        sbx.kill()


def test_a_kill_gives_the_host_its_blocks_back(node: NodeServer) -> None:
    baseline = _held(node)
    sbx = Sandbox.create(timeout=300)
    _write_gib(sbx)
    assert _held(node) > baseline + (WRITTEN_MIB << 20) * 9 // 10
    started = time.monotonic()
    assert sbx.kill()
    killed_in = time.monotonic() - started
    took = _back_within(node, baseline)
    print(f"kill: {killed_in:.2f} s, back in {took:.1f} s after it")
    assert killed_in < 5.0  # a kill does not wait for the trim


def test_a_files_only_pause_then_a_kill_gives_the_host_its_blocks_back(
    node: NodeServer,
) -> None:
    baseline = _held(node)
    sbx = Sandbox.create(timeout=300)
    _write_gib(sbx)
    assert sbx.pause(mode="filesystem")
    assert _held(node) > baseline + (WRITTEN_MIB << 20) * 9 // 10  # paused: its files kept
    Sandbox.kill(sbx.sandbox_id)
    took = _back_within(node, baseline)
    print(f"files-only pause, kill: back in {took:.1f} s")


def _create_raw(node: NodeServer) -> httpx.Response:
    return httpx.post(f"{node.url}/sandboxes", headers={"X-API-KEY": API_KEY},
                      json={"templateID": "base", "timeout": 60}, timeout=120)


def test_a_host_disk_above_the_watermark_refuses_creates_until_space_is_freed(
    node: NodeServer,
) -> None:
    fs = node.home.parent
    usage = disk_usage(fs)
    usable = usage.used_bytes + usage.available_bytes
    assert usage.percent < WATERMARK - 5, usage
    filler = fs / "filler"  # anything else on the host filling its disk
    subprocess.run(["fallocate", "-l", str(int(usable * (WATERMARK + 3) / 100) - usage.used_bytes),
                    str(filler)], check=True)
    try:
        assert disk_usage(fs).percent > WATERMARK
        refused = _create_raw(node)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["code"] == 429 and "watermark" in body["message"], body
        assert f"{WATERMARK}%" in body["message"], body
        assert refused.headers["Retry-After"] == str(RETRY_AFTER_S)
        with pytest.raises(RateLimitException, match="watermark"):
            Sandbox.create(timeout=60, retries=0)
        assert [s for s in Sandbox.list().next_items()] == []
    finally:
        filler.unlink()
    sbx = Sandbox.create(timeout=60)  # space freed: admitted again
    assert sbx.commands.run("echo ok").stdout.strip() == "ok"
    sbx.kill()
