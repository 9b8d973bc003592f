"""Fixtures for storage tests: throwaway aenv homes under /tmp/aenv-test-* that never leak mounts.

Every home is checked at teardown: whatever is still mounted under it is unmounted (the test
then fails: a leak is a bug), and the tree is deleted only once nothing is mounted inside, so a
failing test can never make ``rmtree`` walk into a mounted filesystem.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aenv.storage.layers import Layer, LayerStore
from aenv.storage.mounts import mounts_under
from aenv.storage.reflink_fs import ReflinkPool
from aenv.storage.rootfs import RootfsStore
from aenv.storage.workspaces import WorkspaceStore
from aenv.templates.busybox import build_busybox
from tests.s3 import S3Server, run_s3_server
from tests.storage.workspace_pool import (
    force_clean,
    leftovers_settled,
    workspace_store,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting overlays needs root")
needs_busybox = pytest.mark.skipif(
    not Path("/bin/busybox").exists(), reason="needs busybox-static (/bin/busybox)"
)


def _new_home() -> Path:
    return Path(tempfile.mkdtemp(prefix="aenv-test-", dir="/tmp"))


def _destroy_home(home: Path) -> list[str]:
    """Unmount everything under ``home``, then delete it. Returns what was still mounted."""
    leaked = mounts_under(home)
    for mount_point in leaked:
        subprocess.run(["umount", "--lazy", mount_point], check=False, capture_output=True)
    still = mounts_under(home)
    if still:
        raise RuntimeError(f"could not unmount {still}; not deleting {home}")
    shutil.rmtree(home, ignore_errors=True)
    return leaked


@pytest.fixture
def aenv_home() -> Iterator[Path]:
    """A fresh aenv home; fails the test at teardown if a mount under it leaked."""
    home = _new_home()
    leaked: list[str] = []
    try:
        yield home
    finally:
        leaked = _destroy_home(home)
    assert not leaked, f"mounts leaked: {leaked}"


@pytest.fixture
def layers(aenv_home: Path) -> LayerStore:
    return LayerStore.at_home(aenv_home)


@pytest.fixture
def roots(aenv_home: Path) -> RootfsStore:
    return RootfsStore.at_home(aenv_home)


@pytest.fixture(scope="session")
def shared_home() -> Iterator[Path]:
    """One home per test session for read-only layers several tests mount as lowers."""
    home = _new_home()
    try:
        yield home
    finally:
        _destroy_home(home)


@pytest.fixture
async def busybox_layer(shared_home: Path) -> AsyncIterator[Layer]:
    if not Path("/bin/busybox").exists():
        pytest.skip("needs busybox-static (/bin/busybox)")
    result = await build_busybox(LayerStore.at_home(shared_home))
    yield result.layer


def make_tree(root: Path, files: dict[str, str]) -> Path:
    """A directory tree with the given files (relative path -> text); returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def snapshot_tree(root: Path) -> dict[str, tuple[int, int, int, str]]:
    """Everything observable about a tree (mode, uid, gid, content or link target) by path."""
    state: dict[str, tuple[int, int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            if path.is_symlink():
                body = "->" + os.readlink(path)
            elif path.is_file():
                body = path.read_bytes().hex()
            else:
                body = ""
            state[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, body)
    return state


def files_in(root: Path) -> set[str]:
    """Relative paths of everything in a tree."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server for the session (tests keep apart by prefix: ``S3Server.location()``).

    A test that stops or restarts its server starts its own with ``tests.s3.run_s3_server``.
    """
    with run_s3_server() as server:
        yield server


# Workspace pools on loop devices (workspace_pool.py): a home per test, and a store on it.


@pytest.fixture
async def home() -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="aenv-ws-test-", dir="/tmp"))
    try:
        yield path
        # The test detached its workspaces; unmounting the pool is the last step of teardown.
        await ReflinkPool(path).unmount()
        leaked = leftovers_settled(path)
        assert not leaked, f"leaked mounts/loop devices: {leaked}"
    finally:
        force_clean(path)
        if not leftovers_settled(path):
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def store(home: Path) -> AsyncIterator[WorkspaceStore]:
    s = await workspace_store(home)
    try:
        yield s
    finally:
        for sandbox_id in s.observe().images:
            await s.detach(sandbox_id)
