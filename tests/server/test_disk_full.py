"""A full disk during a pause's spill and during a snapshot: a clear error, the sandbox lives.

``<home>/staging`` (where snapshots' memory images are written) and ``<home>/paused`` (where
pauses spill) are bind mounts of a 40 MiB loop-mounted ext4 filesystem; the sandbox holds
about 60 MB of written files, so neither image fits. The snapshot must fail with a clear
error and leave the source running with its files; the pause must stand (the sandbox stays
paused in memory) and a resume must thaw it with its files; nothing half-written is visible.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from tests.server.crash_node import MARK, crashable, entries_of

pytestmark = [pytest.mark.gvisor, pytest.mark.timeout(600)]

SMALL_MB = 40


@contextlib.contextmanager
def small_filesystem() -> Iterator[Path]:
    """A fresh ext4 filesystem of :data:`SMALL_MB` MiB, loop-mounted; removed at the end."""
    with tempfile.TemporaryDirectory(prefix="aenv-small-") as scratch:
        image = Path(scratch) / "fs.img"
        mount_point = Path(scratch) / "mnt"
        mount_point.mkdir()
        subprocess.run(["truncate", "-s", f"{SMALL_MB}M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextlib.contextmanager
def bound(source: Path, target: Path) -> Iterator[None]:
    source.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_full_disk_fails_the_snapshot_and_the_spill_and_keeps_the_sandbox() -> None:
    with crashable(pause_hot_s="0") as node:
        sbx = Sandbox.create(timeout=600)
        sbx.files.write(MARK, "kept")
        sbx.commands.run("head -c 60000000 /dev/urandom > /home/user/big && sync")
        digest = sbx.commands.run("md5sum /home/user/big").stdout
        node.server.stop()  # the sandbox runs on
        with small_filesystem() as small, \
                bound(small / "staging", node.home / "staging"), \
                bound(small / "paused", node.home / "paused"):
            node.restart()
            sbx = Sandbox.connect(sbx.sandbox_id, timeout=600)
            started = time.monotonic()
            with pytest.raises(SandboxException) as failed:
                sbx.create_snapshot()
            assert "space" in str(failed.value).lower(), failed.value
            assert time.monotonic() - started < 60
            assert sbx.is_running()
            assert sbx.files.read(MARK) == "kept"
            assert Sandbox.list_snapshots().next_items() == []
            assert entries_of(node.home / "staging") == []

            sbx.pause()  # acknowledged at once (frozen); the spill to disk then fails
            deadline = time.monotonic() + 60
            while "stays paused in memory" not in node.server.log():
                assert time.monotonic() < deadline, node.server.log()[-3000:]
                time.sleep(0.2)
            assert [e for e in entries_of(node.home / "paused") if e.endswith(".partial")] == []
            resumed = Sandbox.connect(sbx.sandbox_id, timeout=600)
            assert resumed.files.read(MARK) == "kept"
            assert resumed.commands.run("md5sum /home/user/big").stdout == digest
            resumed.kill()
            node.server.stop()
        node.restart()  # the home is whole again for the fixture's checks
