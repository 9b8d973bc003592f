"""Idle cost of a bare envd sandbox on the host: PSS of all its processes and CPU while idle.

Boots N sandboxes with bare runsc (``lifecycle_bench.BareEnvd``: the node's OCI config, envd
as init, ``--network=none``) from a given envd bundle, waits until each envd listens, lets
them idle, then sums ``Pss`` (``/proc/<pid>/smaps_rollup``) over every host process of each
sandbox (its cgroups and every process naming its id: sentry, gofer, systrap stubs) and their
CPU (utime + stime from ``/proc/<pid>/stat``) over a window. ``--init sleep`` runs
``/bin/sleep`` as init instead (a bare sandbox with nothing of ours in it); ``--flag`` adds
runsc flags; ``--restored`` measures restores of one checkpoint instead of cold boots (what
the node's template sandboxes and fork children are).

    .venv/bin/python -m bench.envd_idle --bundle /tmp/envd-bundle-lean -n 5
    .venv/bin/python -m bench.envd_idle --init sleep --flag=--platform=ptrace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tests.server.harness import BUNDLE

import bench.lifecycle.bare as lb_bare
import bench.lifecycle_bench as lb
from bench.node_bench.memory import sandbox_pids

#: The base template's root layer in the shared test layer cache (debootstrapped Debian).
DEFAULT_LAYER = Path(
    "/var/cache/aenv-test/layers/4a8a39ce7cd55d5edf8b5a78c09e6e2fa5ca15bd0bc78777f2c24aac352b0930"
)
CLK_TCK = os.sysconf("SC_CLK_TCK")


class IdleSandboxes(lb.BareEnvd):
    """BareEnvd with a chosen init and extra runsc flags."""

    def __init__(self, layer: Path, init: str, flags: list[str]) -> None:
        super().__init__([layer], 2, 512)
        self.init = init
        self.flags = [*self.flags, *flags]

    def _prepare(self) -> tuple[str, Path]:
        cid, bundle = super()._prepare()
        if self.init == "sleep":
            config = json.loads((bundle / "config.json").read_text())
            config["process"]["args"] = ["/bin/sleep", "100000"]
            (bundle / "config.json").write_text(json.dumps(config))
        return cid, bundle

    def start(self) -> str:
        if self.init != "sleep":
            return self.boot()
        cid, bundle = self._prepare()
        self.live.add(cid)
        self._runsc("run", "-detach", f"-bundle={bundle}", cid)
        return cid


def cpu_ticks(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total


def measure(args: argparse.Namespace) -> dict[str, Any]:
    lb_bare.BUNDLE = args.bundle.resolve()  # BareEnvd mounts it
    pool = IdleSandboxes(args.layer, args.init, args.flag)
    ids: list[str] = []
    image: Path | None = None
    try:
        if args.restored:
            parent = pool.start()
            time.sleep(2)
            _, image, _ = pool.checkpoint(parent, leave_running=False)
            for _ in range(args.n):
                cid, _ = pool.restore(image)
                pool.exec(cid, "/bin/true")
                ids.append(cid)
        else:
            ids = [pool.start() for _ in range(args.n)]
        time.sleep(args.settle)
        pids = {cid: sandbox_pids(cid, lb.BARE_CGROUP) for cid in ids}
        pss = [lb.pss_mib(p) for p in pids.values()]
        before = {cid: cpu_ticks(p) for cid, p in pids.items()}
        start = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - start
        cpu = [100.0 * (cpu_ticks(pids[cid]) - before[cid]) / CLK_TCK / elapsed for cid in ids]
    finally:
        pool.close()
        if image is not None:
            lb.rm_image(image)
    return {
        "bundle": str(args.bundle),
        "init": args.init,
        "flags": args.flag,
        "restored": args.restored,
        "n": args.n,
        "window_s": args.window,
        "pss_mib": [p["pss_mib"] for p in pss],
        "pss_median_mib": statistics.median(p["pss_mib"] for p in pss),
        "pss_anon_shmem_median_mib": statistics.median(
            p["pss_anon_mib"] + p["pss_shmem_mib"] for p in pss
        ),
        "pss_file_median_mib": statistics.median(p["pss_file_mib"] for p in pss),
        "cpu_pct": [round(c, 2) for c in cpu],
        "cpu_pct_median": round(statistics.median(cpu), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=BUNDLE)
    parser.add_argument("--layer", type=Path, default=DEFAULT_LAYER)
    parser.add_argument("--init", choices=("envd", "sleep"), default="envd")
    parser.add_argument("--flag", action="append", default=[], help="extra runsc flag")
    parser.add_argument("--restored", action="store_true")
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--settle", type=float, default=5.0, help="idle s before measuring")
    parser.add_argument("--window", type=float, default=20.0, help="CPU window, s")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
