"""Fixtures for driver tests: real runsc sandboxes in real network slots.

``sandboxes`` boots busybox-rooted sandboxes running the real envd bundle, tracks everything it
made and tears it down after the test, on failure too (printing the sandboxes' logs), then
checks that no runsc container, process, cgroup, bundle, netns or veth is left.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from aenv.core import ids
from aenv.core.net import NetSlot
from aenv.network import guest_http
from aenv.network.pool import SlotPool
from aenv.runtime.base import ENVD_MOUNT, ENVD_PORT, Instance, SandboxSpec
from aenv.runtime.gvisor import GvisorConfig, GvisorRuntime
from tests.network.fixtures import internet, nft_table_cleanup, pool
from tests.rootfs import make_busybox_root

__all__ = ["internet", "nft_table_cleanup", "pool"]

REPO = Path(__file__).resolve().parents[2]
BUILT_BUNDLE = REPO / "build" / "envd-bundle"
#: Test sandboxes' cgroups live apart from a node's (``/aenv``).
CGROUP_PARENT = "/aenv-test"
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: A cold envd start in gVisor (gofer-served imports from a cold page cache) takes ~2 s.
ENVD_READY_TIMEOUT_S = 60.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="session", autouse=True)
def cgroup_parent_cleanup() -> Iterator[None]:
    """Remove the (then empty) test cgroup parent in every hierarchy at the end."""
    yield
    for hierarchy in CGROUP_ROOT.iterdir():
        with contextlib.suppress(OSError):
            (hierarchy / CGROUP_PARENT.strip("/")).rmdir()


@pytest.fixture(scope="session")
def envd_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of build/envd-bundle: a rebuild swaps that directory, and a sandbox
    whose bind-mounted bundle is swapped sees an empty directory."""
    if not (BUILT_BUNDLE / "bin" / "envd").exists():
        subprocess.run(
            [str(REPO / ".venv" / "bin" / "aenv"), "envd", "bundle", "--out", str(BUILT_BUNDLE)],
            check=True, timeout=1200,
        )
    for _ in range(3):
        copy = tmp_path_factory.mktemp("envd") / "bundle"
        try:
            shutil.copytree(BUILT_BUNDLE, copy, symlinks=True)
            json.loads((copy / "manifest.json").read_text())
            if (copy / "bin" / "envd").exists():
                return copy
        except (OSError, ValueError):
            continue  # swapped while we copied
    raise RuntimeError("could not copy a complete envd bundle")


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with busybox as its only program (as in tests/envd/test_bundle.py)."""
    root = tmp_path_factory.mktemp("rootfs") / "root"
    return make_busybox_root(root, extra_dirs=("www",))


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """Short on purpose: runsc's control socket path (<root>/runsc-<id>.sock) must fit 107
    bytes, which pytest's tmp_path does not."""
    path = Path(tempfile.mkdtemp(prefix="aenv-g", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def gvisor_config(state_dir: Path) -> GvisorConfig:
    return GvisorConfig(
        state_dir=state_dir / "sandboxes", cgroup_parent=CGROUP_PARENT, keep_logs=True
    )


@dataclass
class Booted:
    instance: Instance
    spec: SandboxSpec

    @property
    def slot(self) -> NetSlot:
        return self.instance.net

    @property
    def id(self) -> str:
        return self.instance.sandbox_id


@dataclass
class SandboxFactory:
    runtime: GvisorRuntime
    pool: SlotPool
    rootfs_template: Path
    envd_bundle: Path
    workdir: Path
    booted: list[Booted] = field(default_factory=list)
    #: Every sandbox id this factory booted or was handed (for the leak check).
    ever: list[str] = field(default_factory=list)

    def spec(self, *, memory_mb: int = 256, cpu_count: int = 1,
             files: dict[str, str] | None = None) -> SandboxSpec:
        sandbox_id = ids.new_sandbox_id()
        self.ever.append(sandbox_id)  # failed boots too: they must not leave anything either
        rootfs = self.workdir / sandbox_id / "rootfs"
        shutil.copytree(self.rootfs_template, rootfs, symlinks=True)
        for name, text in (files or {}).items():
            (rootfs / name.lstrip("/")).write_text(text)
        return SandboxSpec(
            sandbox_id=sandbox_id,
            rootfs=rootfs,
            envd_bundle=self.envd_bundle,
            cpu_count=cpu_count,
            memory_mb=memory_mb,
        )

    async def boot(self, *, wait_envd: bool = True, **kwargs: Any) -> Booted:
        spec = self.spec(**kwargs)
        slot = await self.pool.acquire()
        try:
            instance = await self.runtime.boot(spec, slot)
        except BaseException:
            await self.pool.release(slot)
            raise
        booted = self.track(instance, spec)
        if wait_envd:
            await self.envd_ready(booted)
        return booted

    def track(self, instance: Instance, spec: SandboxSpec) -> Booted:
        """Tear this sandbox (and its slot) down with the others."""
        booted = Booted(instance, spec)
        self.booted.append(booted)
        if instance.sandbox_id not in self.ever:
            self.ever.append(instance.sandbox_id)
        return booted

    async def envd_ready(self, booted: Booted, timeout: float = ENVD_READY_TIMEOUT_S) -> float:
        return await guest_http.wait_http(booted.slot, ENVD_PORT, "/health", timeout=timeout)

    async def health(self, booted: Booted) -> int:
        """envd's /health status through the slot, or 0 when it does not answer."""
        try:
            await guest_http.wait_http(booted.slot, ENVD_PORT, "/health", timeout=3.0)
        except Exception:
            return 0
        return 204

    async def py(self, booted: Booted, code: str, *args: str, user: str | None = None,
                 timeout: float = 60.0) -> str:
        """Run Python (the envd bundle's interpreter) inside the sandbox; its stdout."""
        loader = json.loads((self.envd_bundle / "manifest.json").read_text())["loader"]
        lib = f"{ENVD_MOUNT}/lib"
        argv = [f"{lib}/{loader}", "--library-path", lib, f"{lib}/python3", "-S", "-c", code,
                *args]
        done = await self.runtime.runsc.exec(
            booted.instance.runtime_id, argv, user=user, timeout=timeout,
            env={"PYTHONHOME": ENVD_MOUNT},
        )
        return done.text

    async def sh(self, booted: Booted, script: str, *, user: str | None = None,
                 timeout: float = 60.0, check: bool = True) -> str:
        done = await self.runtime.runsc.exec(
            booted.instance.runtime_id, ["/bin/sh", "-c", script], user=user, timeout=timeout,
            check=check,
        )
        return done.text

    def logs(self, booted: Booted) -> str:
        out = []
        for path in sorted(self.runtime.log_dir(booted.id).glob("*")):
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    async def destroy(self, booted: Booted) -> None:
        await self.runtime.destroy(booted.instance)
        await self.pool.release(booted.slot)
        if booted in self.booted:
            self.booted.remove(booted)

    async def close(self, *, failed: bool) -> list[str]:
        errors = []
        for booted in list(self.booted):
            if failed:
                print(f"\n===== logs of sandbox {booted.id}\n{self.logs(booted)}")
            try:
                await self.destroy(booted)
            except Exception as exc:
                errors.append(f"{booted.id}: {exc!r}")
        return errors


def leftovers(runtime: GvisorRuntime, sandbox_ids: list[str]) -> list[str]:
    """Everything of these sandboxes still on the machine."""
    found = []
    root = str(runtime.runsc.config.root)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if root.encode() in (entry / "cmdline").read_bytes():
                    found.append(f"process {entry.name}")
    for sid in sandbox_ids:
        for controller in ("memory", "cpu", "pids", "systemd"):
            if (CGROUP_ROOT / controller / CGROUP_PARENT.strip("/") / sid).exists():
                found.append(f"cgroup {controller}/{sid}")
        if (runtime.bundle_dir(sid)).exists():
            found.append(f"bundle of {sid}")
    return found


@pytest.fixture
async def sandboxes(
    request: pytest.FixtureRequest,
    pool: SlotPool,
    state_dir: Path,
    busybox_rootfs: Path,
    envd_bundle: Path,
) -> AsyncIterator[SandboxFactory]:
    runtime = GvisorRuntime(gvisor_config(state_dir))
    factory = SandboxFactory(runtime, pool, busybox_rootfs, envd_bundle, state_dir / "work")
    try:
        yield factory
    finally:
        errors = await factory.close(failed=request.node.stash.get(_FAILED, True))
        await runtime.aclose()
        assert not errors, errors
    assert await runtime.runsc.list() == []
    assert leftovers(runtime, factory.ever) == []
