"""Two nodes on this machine sharing one S3 repository (a real moto server process).

A template built on node A, a snapshot taken on A and a sandbox paused on A all start on node B
after A is killed and its home deleted: B has nothing of A's but the repository. Each node has
its own ``AENV_HOME``, port and network-slot range; they share only the layers directory of
the test cache (so B does not rebuild the Debian base) — the built template's own layer is
removed from it before B starts, so B must fetch it from the repository.

Run with ``AENV_TEST_SLOT_BASE`` set to a slot range of one's own when other servers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import ServiceBusyException

from aenv.storage.manifest import SnapshotManifest
from aenv.storage.objects import ObjectStore
from tests.conftest import free_port
from tests.counter import COUNT
from tests.s3 import S3Server, run_s3_server
from tests.server.harness import (
    CACHE,
    NodeServer,
    cleanup_home,
    client_env,
    kill_leaked,
    restore_environ,
    start_server,
)

pytestmark = pytest.mark.timeout(900)


@contextlib.contextmanager
def sdk_env(node: NodeServer) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in client_env(node)}
    os.environ.update(client_env(node))
    try:
        yield
    finally:
        restore_environ(saved)


def s3_settings(s3: S3Server, prefix: str) -> dict[str, str]:
    return {
        "repository": s3.url(prefix), "s3_endpoint": s3.endpoint, "s3_region": "us-east-1",
        "s3_access_key_id": "aenv-test-key", "s3_secret_access_key": "aenv-test-secret",
        "s3_allow_http": "true", "pause_hot_s": "0",
    }


def wait_for(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_template_snapshot_and_paused_sandbox_move_to_another_node() -> None:
    nonce = secrets.token_hex(4)
    with run_s3_server() as s3:
        settings = s3_settings(s3, f"shared-{nonce}")
        node_a = start_server(free_port(), **settings)
        try:
            with sdk_env(node_a):
                Template.build(
                    Template().from_template("base").run_cmd(f"echo built-{nonce} > ~/b.txt"),
                    f"moved-{nonce}")
                sbx = Sandbox.create(timeout=600)
                sbx.files.write("/home/user/kept.txt", f"files-{nonce}")
                start_counter(sbx)
                snapshot = sbx.create_snapshot(name=f"snap-{nonce}")
                before = int(sbx.files.read("/tmp/count").strip())
                paused_id = pause_until_published(node_a, sbx)
        finally:
            crash_and_scrub(node_a)
        assert not node_a.home.exists()
        # B must fetch the build's own layer from the repository, not find it in the cache.
        built_layer = _top_layer(s3, f"shared-{nonce}", f"moved-{nonce}")
        shutil.rmtree(built_layer)
        (built_layer.parent / f"{built_layer.name}.json").unlink()
        node_b = start_server(free_port(), **settings)
        try:
            with sdk_env(node_b):
                from_template = Sandbox.create(f"moved-{nonce}", timeout=120)
                assert from_template.files.read("/home/user/b.txt").strip() == f"built-{nonce}"
                from_template.kill()
                from_snapshot = Sandbox.create(snapshot.snapshot_id, timeout=120)
                assert from_snapshot.files.read("/home/user/kept.txt") == f"files-{nonce}"
                from_snapshot.kill()
                resumed = Sandbox.connect(paused_id, timeout=120)
                assert resumed.files.read("/home/user/kept.txt") == f"files-{nonce}"
                first = int(resumed.files.read("/tmp/count").strip())
                time.sleep(0.5)
                second = int(resumed.files.read("/tmp/count").strip())
                assert second > first >= before, (before, first, second)
                resumed.kill()
        finally:
            node_b.stop()
            kill_leaked(node_b.home)
            cleanup_home(node_b.home)


def start_counter(sbx: Sandbox) -> None:
    """A process that counts into /tmp/count every 0.1 s (its state must survive a move)."""
    sbx.commands.run(COUNT)
    time.sleep(1.0)


def pause_until_published(node: NodeServer, sbx: Sandbox) -> str:
    """Pause ``sbx`` and wait until its spill has published it to the repository."""
    sbx.pause()
    wait_for("the pause to reach the repository",
             lambda: '"published": true' in _instance(node, sbx.sandbox_id))
    return sbx.sandbox_id


def crash_and_scrub(node: NodeServer) -> None:
    """kill -9 the node, its sandboxes with it, and delete everything it left here."""
    node.kill9()
    kill_leaked(node.home)
    scrub(node)


def scrub(node: NodeServer) -> None:
    """Delete everything a killed node left on this machine: its mounts, network namespaces
    and home (its sandboxes are already killed)."""
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(node.home) + "/")]
    for mount_point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=False)
    first = int(node.env["AENV_NET_FIRST_INDEX"])
    last = int(node.env["AENV_NET_LAST_INDEX"])
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("aenv-") and name[5:].isdigit() and first <= int(name[5:]) <= last:
            subprocess.run(["ip", "netns", "delete", name], check=False)
    cleanup_home(node.home)


def _instance(node: NodeServer, sandbox_id: str) -> str:
    db = sqlite3.connect(node.home / "state.db")
    try:
        row = db.execute("SELECT instance FROM sandboxes WHERE sandbox_id = ?",
                         (sandbox_id,)).fetchone()
        return row[0] or "" if row else ""
    finally:
        db.close()


def _top_layer(s3: S3Server, prefix: str, name: str) -> Path:
    """The top layer of the template image named ``name``, read from the repository."""
    async def read() -> str:
        store = ObjectStore(s3.location(prefix))
        for info in await store.list("manifests/"):
            manifest = SnapshotManifest.model_validate_json(await store.get_bytes(info.key))
            if manifest.kind == "template" and name in manifest.names:
                return manifest.layers[-1].layer_id
        raise AssertionError(f"no template image named {name} in the repository")
    return CACHE / "layers" / asyncio.run(read())


def test_with_the_repository_down_a_snapshot_fails_clearly_and_a_pause_stays_local() -> None:
    with run_s3_server() as s3:
        node = start_server(free_port(), **s3_settings(s3, f"down-{secrets.token_hex(4)}"))
        try:
            with sdk_env(node):
                sbx = Sandbox.create(timeout=600)
                sbx.files.write("/home/user/kept.txt", "kept")
                s3.stop()
                started = time.monotonic()
                with pytest.raises(ServiceBusyException) as failed:
                    sbx.create_snapshot()
                took = time.monotonic() - started
                assert "repository" in str(failed.value), failed.value
                assert took < 90, took
                assert sbx.is_running()
                assert sbx.files.read("/home/user/kept.txt") == "kept"
                assert _entries(node.home / "staging") == []
                sbx.pause()
                wait_for("the spill", lambda: "stays paused on this node only" in node.log())
                resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
                assert resumed.files.read("/home/user/kept.txt") == "kept"
                resumed.kill()
        finally:
            node.stop()
            kill_leaked(node.home)
            cleanup_home(node.home)


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def test_a_disk_workspace_paused_on_one_node_resumes_on_another() -> None:
    nonce = secrets.token_hex(4)
    with run_s3_server() as s3:
        settings = {**s3_settings(s3, f"disk-{nonce}"), "workspace": "disk",
                    "disk_size_mb": "1024", "workspace_pool_bytes": str(8 << 30),
                    "warm_pool_size": "0"}
        node_a = start_server(free_port(), **settings)
        try:
            with sdk_env(node_a):
                sbx = Sandbox.create(timeout=600)
                sbx.commands.run("head -c 50000000 /dev/urandom > ~/data && md5sum ~/data "
                                 "> ~/data.md5")
                start_counter(sbx)
                # Published, resumed here, changed, published again under the same id.
                pause_until_published(node_a, sbx)
                sbx = Sandbox.connect(sbx.sandbox_id, timeout=120)
                sbx.files.write("/home/user/second.txt", "after the first pause")
                before = int(sbx.files.read("/tmp/count").strip())
                paused_id = pause_until_published(node_a, sbx)
        finally:
            crash_and_scrub(node_a)
        node_b = start_server(free_port(), **settings)
        try:
            with sdk_env(node_b):
                resumed = Sandbox.connect(paused_id, timeout=120)
                assert resumed.commands.run("md5sum -c ~/data.md5").exit_code == 0
                assert resumed.files.read("/home/user/second.txt") == "after the first pause"
                first = int(resumed.files.read("/tmp/count").strip())
                time.sleep(0.5)
                assert int(resumed.files.read("/tmp/count").strip()) > first >= before
                resumed.kill()
        finally:
            node_b.stop()
            kill_leaked(node_b.home)
            cleanup_home(node_b.home)
