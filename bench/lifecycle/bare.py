"""Bare ``runsc`` sandboxes equivalent to the node's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.server.harness import BUNDLE as HARNESS_BUNDLE

from aenv.core.net import NetSlot
from aenv.core.settings import Settings
from aenv.runtime import oci, urpc
from aenv.runtime.base import ENVD_PORT, SandboxSpec
from aenv.runtime.gvisor_checkpoint import CHECKPOINT_ARG
from aenv.runtime.runsc import RUNSC, RunscConfig
from aenv.storage.manifest import IMAGE_FILES
from bench.lifecycle.common import (
    BARE_CGROUP,
    dir_bytes,
)
from bench.node_bench.common import ms_since, remove_cgroups

#: Bare sandboxes run on the node's default platform, as its own do.
NODE_PLATFORM = str(Settings.model_fields["runsc_platform"].default)

#: The envd bundle the sandboxes mount (bench/envd_idle.py points it at another one).
BUNDLE: Path = HARNESS_BUNDLE


# -- bare runsc -------------------------------------------------------------------------------


class BareEnvd:
    """Sandboxes equivalent to the node's, started with bare ``runsc``.

    The bundle is the node's own ``oci.sandbox_config`` (envd as init with the node's
    arguments, the envd bundle and sudo mounts, capabilities, rlimits, cgroup resources) with
    two differences: no network namespace (``--network=none``: envd listens on loopback; the
    node gives runsc a netns with a veth and runs it through an ``unshare`` wrapper) and no
    /etc bind mounts. Each sandbox gets its own overlay of the template's layers (runsc needs
    a root directory per sandbox). Flags: the node's (``RunscConfig.global_flags``) with our
    own ``--root``. Ids have a fixed length (runsc matches ids by prefix).
    """

    def __init__(self, lowers: list[Path], cpu_count: int, memory_mb: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lb-", dir="/tmp"))  # short: socket paths
        self.lowers = lowers
        self.cpu_count = cpu_count
        self.memory_mb = memory_mb
        self.flags = RunscConfig(
            root=self.dir / "root", network="none", platform=NODE_PLATFORM
        ).global_flags()
        self.count = 0
        self.mounts: dict[str, Path] = {}  # cid → its merged rootfs
        self.live: set[str] = set()
        self.lock = threading.Lock()
        #: Put before runsc on every call (a subclass's wrapper, e.g. bench/ksm_bench.py).
        self.launcher: tuple[str, ...] = ()

    def _new_id(self) -> str:
        with self.lock:
            self.count += 1
            return f"lb-{self.count:07d}"

    def _runsc(self, *args: str, check: bool = True) -> tuple[float, str]:
        """Run runsc to completion: wall ms and its output. Files, not pipes: a detached
        sandbox inherits them (and ``timeout=`` would round timings up to 50 ms polls)."""
        with tempfile.TemporaryFile(dir=self.dir) as out:
            start = time.perf_counter()
            done = subprocess.run(
                [*self.launcher, str(RUNSC), *self.flags, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                check=False,
            )
            elapsed = ms_since(start)
            out.seek(0)
            text = out.read().decode(errors="replace")
        if check and done.returncode != 0:
            raise RuntimeError(f"bare runsc {args[0]} failed ({done.returncode}): {text[-1500:]}")
        return elapsed, text

    def _prepare(self) -> tuple[str, Path]:
        """A new id with its own rootfs overlay and bundle (untimed)."""
        cid = self._new_id()
        base = self.dir / cid
        for name in ("upper", "work", "merged"):
            (base / name).mkdir(parents=True)
        lower = ":".join(str(p) for p in reversed(self.lowers))
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={base / 'upper'},workdir={base / 'work'}",
                str(base / "merged"),
            ],
            check=True,
        )
        self.mounts[cid] = base / "merged"
        spec = SandboxSpec(
            sandbox_id=cid,
            rootfs=base / "merged",
            envd_bundle=BUNDLE,
            cpu_count=self.cpu_count,
            memory_mb=self.memory_mb,
            envd_args=("--user", "user", "--workdir", "/home/user"),
        )
        slot = NetSlot(0, "none", "/nonexistent", "none", "none")
        # The envd bundle has volume slots: unused ones are bound to an empty directory (the
        # node's is a read-only tmpfs, runtime/slot_filler.py; nothing writes to it here).
        filler = self.dir / "slot-filler"
        filler.mkdir(exist_ok=True)
        config = oci.sandbox_config(spec, slot, cgroups_path=f"/{BARE_CGROUP}/{cid}",
                                    slot_filler=filler)
        config["linux"]["namespaces"] = [
            ns for ns in config["linux"]["namespaces"] if ns["type"] != "network"
        ]
        bundle = base / "bundle"
        bundle.mkdir()
        oci.write_config(bundle, config)
        return cid, bundle

    def boot(self) -> str:
        """A cold-booted sandbox whose envd listens (untimed; ~2 s of envd imports)."""
        cid, bundle = self._prepare()
        self.live.add(cid)
        self._runsc("run", "-detach", f"-bundle={bundle}", cid)
        listening = f":{ENVD_PORT:04X} 00000000:0000 0A"
        self.exec(
            cid, "/bin/sh", "-c", f"until grep -q '{listening}' /proc/net/tcp; do sleep 0.05; done"
        )
        return cid

    def exec(self, cid: str, *argv: str) -> float:
        return self._runsc("exec", cid, *argv)[0]

    def pause(self, cid: str) -> float:
        return self._runsc("pause", cid)[0]

    def resume(self, cid: str) -> float:
        return self._runsc("resume", cid)[0]

    def checkpoint(self, cid: str, *, leave_running: bool) -> tuple[float, Path, int]:
        """``checkpoint --compression=none`` into a new directory: ms, image, bytes."""
        image = self.dir / f"img-{self._new_id()}"
        ms, _ = self._runsc(
            "checkpoint",
            "--compression=none",
            f"--image-path={image}",
            *(["--leave-running"] if leave_running else []),
            cid,
        )
        if not leave_running:
            self.live.discard(cid)
        return ms, image, dir_bytes(image)

    def checkpoint_socket(self, cid: str) -> tuple[float, Path, int]:
        """The same save as ``checkpoint --leave-running``, sent over the sandbox's control
        socket as the node sends it (no CLI started): ms, image, bytes."""
        image = self.dir / f"img-{self._new_id()}"
        image.mkdir()
        fds = [os.open(image / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
               for name in IMAGE_FILES]
        try:
            start = time.perf_counter()
            asyncio.run(urpc.call(self.dir / "root" / f"runsc-{cid}.sock",
                                  "containerManager.Checkpoint", CHECKPOINT_ARG, files=fds,
                                  timeout=60.0))
            elapsed = ms_since(start)
        finally:
            for fd in fds:
                os.close(fd)
        return elapsed, image, dir_bytes(image)

    def prepare_restore(self) -> tuple[str, Path]:
        cid, bundle = self._prepare()
        self.live.add(cid)
        return cid, bundle

    def precreate(self) -> tuple[str, Path]:
        """``runsc create`` of a new id (untimed): the sandbox and gofer processes started, the
        container not; a later ``restore`` into it picks them up (what the node's pre-created
        pool does)."""
        cid, bundle = self.prepare_restore()
        self._runsc("create", f"-bundle={bundle}", cid)
        return cid, bundle

    def start_sleep(self) -> str:
        """A sandbox whose init is ``/bin/sleep`` (nothing of ours in it), started."""
        cid, bundle = self._prepare()
        config = json.loads((bundle / "config.json").read_text())
        config["process"]["args"] = ["/bin/sleep", "100000"]
        (bundle / "config.json").write_text(json.dumps(config))
        self.live.add(cid)
        self._runsc("run", "-detach", f"-bundle={bundle}", cid)
        return cid

    def restore(self, image: Path, prepared: tuple[str, Path] | None = None) -> tuple[str, float]:
        """``restore -detach`` of ``image`` into a new sandbox: its id and the ms it took."""
        cid, bundle = prepared or self.prepare_restore()
        ms, _ = self._runsc("restore", "-detach", f"-image-path={image}", f"-bundle={bundle}", cid)
        return cid, ms

    def delete(self, cid: str) -> None:
        self._runsc("delete", "--force", cid, check=False)
        self.live.discard(cid)
        remove_cgroups(f"{BARE_CGROUP}/{cid}")
        merged = self.mounts.pop(cid, None)
        if merged is not None:
            subprocess.run(["umount", "-l", str(merged)], check=False)
            shutil.rmtree(merged.parent, ignore_errors=True)

    def close(self) -> None:
        _, listing = self._runsc("list", "-quiet", check=False)
        for cid in set(listing.split()) | set(self.live):
            self.delete(cid)
        for cid in list(self.mounts):
            self.delete(cid)
        remove_cgroups(BARE_CGROUP)
        shutil.rmtree(self.dir, ignore_errors=True)


def rm_image(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
