"""The bare runsc baseline: a node sandbox's bundle run by ``runsc`` alone, no node."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.server.harness import BUNDLE

from aenv.core.net import NetSlot
from aenv.core.settings import Settings
from aenv.runtime import oci
from aenv.runtime.base import SandboxSpec
from aenv.runtime.runsc import RUNSC, RunscConfig
from bench.node_bench.common import BARE_CGROUP, BareSample, cgroup_cpu_ms, ms_since, remove_cgroups
from bench.node_bench.node import Node

#: Bare sandboxes run on the node's default platform, as its own do.
NODE_PLATFORM = str(Settings.model_fields["runsc_platform"].default)


class BareRunsc:
    """``runsc run -detach`` of a bundle equivalent to a node sandbox's, and ``exec``.

    The bundle is the node's own ``oci.sandbox_config`` for the same CPU/memory (so the same
    mounts, capabilities, rlimits and cgroup resources), with three differences: the root is
    an overlay of the template's layer with a throwaway upper (runsc creates mount points in
    its root even when that is read-only, and a shared layer must never change), init is
    ``/bin/sleep 1000`` (the node's is envd) and there is no network (``--network=none``; the
    node gives runsc a pooled netns with a veth and runs it through an ``unshare`` wrapper).
    The runsc flags are the node's (``RunscConfig.global_flags``) with our own ``--root``.
    """

    def __init__(self, rootfs: Path, cpu_count: int, memory_mb: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nb-", dir="/tmp"))  # short: socket paths
        for name in ("upper", "work", "merged"):
            (self.dir / name).mkdir()
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={rootfs},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
                str(self.dir / "merged"),
            ],
            check=True,
        )
        self.rootfs = self.dir / "merged"
        self.cpu_count = cpu_count
        self.memory_mb = memory_mb
        self.flags = RunscConfig(
            root=self.dir / "root", network="none", platform=NODE_PLATFORM
        ).global_flags()
        self.count = 0

    def _config(self, cid: str) -> dict[str, Any]:
        spec = SandboxSpec(
            sandbox_id=cid,
            rootfs=self.rootfs,
            envd_bundle=BUNDLE,
            cpu_count=self.cpu_count,
            memory_mb=self.memory_mb,
        )
        slot = NetSlot(0, "none", "/nonexistent", "none", "none")
        config = oci.sandbox_config(spec, slot, cgroups_path=f"/{BARE_CGROUP}/{cid}")
        config["process"]["args"] = ["/bin/sleep", "1000"]
        config["mounts"] = [
            m for m in config["mounts"] if m["destination"] not in ("/opt/aenv/envd", oci.SUDO_PATH)
        ]
        config["linux"]["namespaces"] = [
            ns for ns in config["linux"]["namespaces"] if ns["type"] != "network"
        ]
        return config

    def _runsc(self, *args: str, check: bool = True) -> float:
        """Run runsc to completion; wall ms. No ``timeout=``: Popen would poll in 50 ms
        sleeps and round the timing up (RUNTIME-NOTES)."""
        with open(self.dir / "runsc.err", "ab") as err:
            start = time.perf_counter()
            done = subprocess.run(
                [str(RUNSC), *self.flags, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                check=False,
            )
            elapsed = ms_since(start)
        if check and done.returncode != 0:
            tail = (self.dir / "runsc.err").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"runsc {args[0]} failed ({done.returncode}): {tail}")
        return elapsed

    def once(self) -> BareSample:
        """One sandbox: run -detach, first exec answered (timed), then delete (untimed)."""
        cid = f"nbench-{self.count:06d}"  # fixed length: runsc matches ids by prefix
        self.count += 1
        bundle = self.dir / cid
        bundle.mkdir()
        oci.write_config(bundle, self._config(cid))
        try:
            run_ms = self._runsc("run", "-detach", f"-bundle={bundle}", cid)
            exec_ms = self._runsc("exec", cid, "/bin/true")
            return BareSample(
                round(run_ms, 3),
                round(exec_ms, 3),
                round(run_ms + exec_ms, 3),
                cgroup_cpu_ms(f"{BARE_CGROUP}/{cid}"),
            )
        finally:
            self._runsc("delete", "--force", cid, check=False)
            remove_cgroups(f"{BARE_CGROUP}/{cid}")
            for path in sorted(bundle.rglob("*"), reverse=True):
                path.unlink() if not path.is_dir() else path.rmdir()
            bundle.rmdir()

    def close(self) -> None:
        remove_cgroups(BARE_CGROUP)
        subprocess.run(["umount", "-l", str(self.dir / "merged")], check=False)
        for path in sorted(self.dir.rglob("*"), reverse=True):
            with contextlib.suppress(OSError):
                path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
        with contextlib.suppress(OSError):
            self.dir.rmdir()


def template_rootfs(node: Node, sandbox_id: str) -> Path:
    """The read-only layer a node sandbox's overlay sits on (the base template has one)."""
    record = json.loads((node.server.home / "sandboxes" / sandbox_id / "rootfs.json").read_text())
    lowers = record.get("lowers", record) if isinstance(record, dict) else record
    if not isinstance(lowers, list) or len(lowers) != 1:
        raise RuntimeError(f"expected one lower layer, found {lowers!r}")
    return Path(lowers[0])
