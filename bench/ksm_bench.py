"""Does KSM share memory between idle gVisor sandboxes? Fork children of one checkpoint (issue 26).

Boots one envd parent sandbox with bare runsc (``bench.lifecycle.bare.BareEnvd``: the node's OCI
config and runsc flags, envd as init, ``--network=none``), checkpoints it with
``--leave-running``, restores N children from that image and lets them idle. Every runsc
command is launched through a tiny wrapper that calls ``prctl(PR_SET_MEMORY_MERGE, 1)`` and
then execs runsc, so the runsc CLI and everything it starts (the sentry, the gofer, systrap's
stub processes) inherit the opt-in (across fork, and across execve on kernels >= 6.7); this is
checked in ``/proc/<pid>/ksm_stat`` of each process kind and recorded.

Then, on the same sandboxes, in turn:

1. ``off``: KSM not running (``run=0``: the opt-in marks the memory mergeable, nothing is
   merged) — per-child PSS (``/proc/<pid>/smaps_rollup`` over every host process of it) split
   into anon / shmem (gVisor's memory file, a memfd) / file, and KSM;
2. ``on``: ``run=1`` at a fast scan rate, once ``full_scans`` advanced ``--scans`` full scans;
   ksmd's CPU (utime + stime of its kernel thread) over that window and the counters;
3. ``on, default rate``: the kernel's default scan rate (100 pages / 20 ms) for a window,
   merged state kept — what KSM costs in the steady state;
4. ``on, 1 in 10 busy``: a python loop rewriting a ``--busy-mb`` bytearray in 10 % of the
   children, fast rate again, ``--scans`` more full scans;
5. ``off, 1 in 10 busy``: unmerged (``run=2``) and stopped (``run=0``).

KSM is always put back off (``run=2`` then ``run=0``, original ``pages_to_scan`` /
``sleep_millisecs``) and every sandbox deleted, also on failure. Writes bench/results/ksm.json
and prints a markdown table.

    AENV_TEST_SLOT_BASE=45000 .venv/bin/python -m bench.ksm_bench --children 16
    AENV_TEST_SLOT_BASE=45000 .venv/bin/python -m bench.ksm_bench --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tests.server.harness import BUNDLE

import bench.lifecycle.bare as lb_bare
from aenv.runtime.runsc import RUNSC
from bench import ksm_svg
from bench.ksm_sysfs import (
    CLK_TCK,
    DEFAULT_PAGES_TO_SCAN,
    DEFAULT_SLEEP_MS,
    KsmdClock,
    counters,
    knob,
    ksm_restored,
    set_knob,
    wait_full_scans,
)
from bench.lifecycle.common import BARE_CGROUP, log
from bench.lifecycle.idle_cpu import cpu_ticks
from bench.node_bench.common import ms_since
from bench.node_bench.memory import kib_fields, process_kind, sandbox_pids

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "ksm.json"
LAYERS = Path("/var/cache/aenv-test/layers")
PR_SET_MEMORY_MERGE = 67
#: The host's memory, for the density column.
HOST_MIB = 24 * 1024

#: Runs in ``python -c`` before runsc: opt in to KSM, then become runsc.
WRAPPER = (
    "import ctypes,os,sys\n"
    f"if ctypes.CDLL(None, use_errno=True).prctl({PR_SET_MEMORY_MERGE}, 1, 0, 0, 0) != 0:\n"
    "    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_MEMORY_MERGE)')\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

#: The busy child's load: rewrite a bytearray every ``period`` s (memset-speed, no syscalls
#: but the sleep).
BUSY = (
    "import sys, time\n"
    "size, period = int(sys.argv[1]) << 20, float(sys.argv[2])\n"
    "b = bytearray(size)\n"
    "pats = [bytes([i]) * size for i in (0x5A, 0xA5)]\n"
    "i = 0\n"
    "while True:\n"
    "    b[:] = pats[i & 1]\n"
    "    i += 1\n"
    "    time.sleep(period)\n"
)

ROLLUP = ("Pss", "Pss_Anon", "Pss_Shmem", "Pss_File", "KSM")


# -- sandboxes --------------------------------------------------------------------------------


class MergeableEnvd(lb_bare.BareEnvd):
    """BareEnvd whose runsc commands run under the KSM opt-in wrapper (``merge``), with ids of
    our own (``ks-NNNNNNN``: another bench's ``lb-`` sandboxes must not match ours)."""

    def __init__(self, layer: Path, *, merge: bool = True) -> None:
        super().__init__([layer], 2, 512)
        self.launcher = (sys.executable, "-I", "-S", "-c", WRAPPER) if merge else ()

    def _new_id(self) -> str:
        with self.lock:
            self.count += 1
            return f"ks-{self.count:07d}"


def base_layer() -> Path:
    """The newest debootstrapped base-template layer in the shared test layer cache."""
    found: list[tuple[float, Path]] = []
    for meta in LAYERS.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            record = json.loads(meta.read_text())
            if "dpkg_options" in record.get("recipe", {}) and (LAYERS / record["id"]).is_dir():
                found.append((float(record.get("created", 0)), LAYERS / record["id"]))
    if not found:
        raise SystemExit(f"no base-template layer in {LAYERS}: pass --layer")
    return max(found)[1]


def ksm_stat(pid: int) -> dict[str, str]:
    stat: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/ksm_stat").read_text().splitlines():
            key, _, value = line.replace(":", " ").partition(" ")
            stat[key] = value.strip()
    return stat


def opt_in(pids: set[int]) -> list[dict[str, Any]]:
    """Per process of a sandbox: its kind and whether it inherited the KSM opt-in."""
    seen = []
    for pid in sorted(pids):
        stat = ksm_stat(pid)
        if stat:
            seen.append({"pid": pid, "kind": process_kind(pid), **stat})
    return seen


def sandbox_memory(pids: set[int]) -> dict[str, Any]:
    """Sum of the smaps_rollup fields over ``pids`` (MiB), and the same per process kind."""
    total = dict.fromkeys(ROLLUP, 0)
    by_kind: dict[str, dict[str, float]] = {}
    for pid in pids:
        try:
            rollup = kib_fields(Path(f"/proc/{pid}/smaps_rollup"), ROLLUP)
        except OSError:
            continue
        kind = by_kind.setdefault(process_kind(pid), dict.fromkeys(ROLLUP, 0.0))
        for key in ROLLUP:
            total[key] += rollup[key]
            kind[key] += rollup[key] / 1024
    return {
        **{key.lower() + "_mib": round(value / 1024, 2) for key, value in total.items()},
        "processes": len(pids),
        "by_kind": {
            name: {k.lower() + "_mib": round(v, 2) for k, v in values.items()}
            for name, values in sorted(by_kind.items())
        },
    }


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


# -- one measurement --------------------------------------------------------------------------


def measure(
    name: str,
    pool: MergeableEnvd,
    parent: str,
    kids: list[str],
    busy: set[str],
    window: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """PSS of every child and the parent now; their CPU and ksmd's over ``window`` s after."""
    pids = {cid: sandbox_pids(cid, BARE_CGROUP) for cid in [parent, *kids]}
    memory = {cid: sandbox_memory(p) for cid, p in pids.items()}
    before = {cid: cpu_ticks(p) for cid, p in pids.items()}
    clock = KsmdClock()
    time.sleep(window)
    elapsed = time.monotonic() - clock.start
    ksmd_pct, _ = clock.pct()
    cpu = {
        cid: round(100.0 * (cpu_ticks(p) - before[cid]) / CLK_TCK / elapsed, 2)
        for cid, p in pids.items()
    }
    children = [memory[cid] | {"id": cid, "busy": cid in busy, "cpu_pct": cpu[cid]} for cid in kids]
    pss = [c["pss_mib"] for c in children]
    idle = [c for c in children if not c["busy"]]
    busy_kids = [c for c in children if c["busy"]]
    kinds = sorted({k for c in children for k in c["by_kind"]})
    result: dict[str, Any] = {
        "mode": name,
        "ksm_run": knob("run"),
        "pages_to_scan": knob("pages_to_scan"),
        "sleep_millisecs": knob("sleep_millisecs"),
        "children": len(kids),
        "busy_children": len(busy_kids),
        "child_pss_p50_mib": p50(pss),
        "child_pss_mean_mib": round(statistics.fmean(pss), 2),
        "child_pss_min_mib": min(pss),
        "child_pss_max_mib": max(pss),
        "children_total_pss_mib": round(sum(pss), 1),
        **{
            f"child_{key.lower()}_p50_mib": p50([c[key.lower() + "_mib"] for c in children])
            for key in ROLLUP[1:]
        },
        "idle_child_pss_p50_mib": p50([c["pss_mib"] for c in idle]),
        "busy_child_pss_p50_mib": p50([c["pss_mib"] for c in busy_kids]),
        "child_by_kind_p50_mib": {
            kind: {
                key.lower() + "_mib": p50(
                    [c["by_kind"].get(kind, {}).get(key.lower() + "_mib", 0.0) for c in children]
                )
                for key in ROLLUP
            }
            for kind in kinds
        },
        # Density at the measured PSS: a mix of idle and busy children counts the mean.
        "fits_in_24_gib": math.floor(HOST_MIB / (statistics.fmean(pss) if busy else p50(pss))),
        "parent": memory[parent],
        "parent_cpu_pct": cpu[parent],
        "idle_child_cpu_pct_p50": p50([c["cpu_pct"] for c in idle]),
        "busy_child_cpu_pct_p50": p50([c["cpu_pct"] for c in busy_kids]),
        "window_s": round(elapsed, 1),
        "ksmd_cpu_pct_window": ksmd_pct,
        "ksm": counters(),
        **extra,
        "per_child": children,
    }
    log(
        f"  {name}: child PSS p50 {result['child_pss_p50_mib']} MiB "
        f"(anon {result['child_pss_anon_p50_mib']}, shmem {result['child_pss_shmem_p50_mib']}, "
        f"file {result['child_pss_file_p50_mib']}, KSM {result['child_ksm_p50_mib']}), "
        f"pages_sharing {result['ksm']['pages_sharing']}, ksmd {ksmd_pct} % over the window"
    )
    return result


def fast_merge(args: argparse.Namespace) -> dict[str, Any]:
    """KSM on at the fast rate until ``--scans`` more full scans are done: their ksmd CPU."""
    set_knob("pages_to_scan", args.pages_to_scan)
    set_knob("sleep_millisecs", args.sleep_ms)
    clock = KsmdClock()
    start = knob("full_scans")
    set_knob("run", 1)
    scans = wait_full_scans(start, args.scans, args.scan_timeout)
    pct, seconds = clock.pct()
    log(f"  {scans} full scans in {seconds} s, ksmd {pct} % of a core")
    return {"full_scans_waited": scans, "merge_s": seconds, "ksmd_cpu_pct_merging": pct}


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    lb_bare.BUNDLE = args.bundle.resolve()  # BareEnvd mounts it
    layer = args.layer or base_layer()
    modes: list[dict[str, Any]] = []
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "kernel": os.uname().release,
        "runsc": str(RUNSC),
        "platform": lb_bare.NODE_PLATFORM,
        "layer": str(layer),
        "bundle": str(args.bundle),
        "children": args.children,
        "argv": sys.argv[1:],
        "host_mib_for_density": HOST_MIB,
    }
    with ksm_restored() as original:
        meta["ksm_original"] = original
        if knob("run") != 0 or knob("pages_sharing") != 0:
            set_knob("run", 2)
            set_knob("run", 0)
        meta["ksm_before"] = counters()
        pool = MergeableEnvd(layer)
        try:
            started = time.perf_counter()
            parent = pool.boot()
            time.sleep(2)
            _, image, image_bytes = pool.checkpoint(parent, leave_running=True)
            pool.exec(parent, "/bin/true")
            kids: list[str] = []
            for _ in range(args.children):
                cid, _ = pool.restore(image)
                pool.exec(cid, "/bin/true")
                kids.append(cid)
            meta["setup_s"] = round(ms_since(started) / 1000, 1)
            meta["image_mib"] = round(image_bytes / 2**20, 1)
            log(f"parent + {args.children} children up in {meta['setup_s']} s")
            meta["opt_in_parent"] = opt_in(sandbox_pids(parent, BARE_CGROUP))
            meta["opt_in_child"] = opt_in(sandbox_pids(kids[0], BARE_CGROUP))
            time.sleep(args.idle)
            window = args.window
            modes.append(measure("off", pool, parent, kids, set(), window, {}))

            merged = fast_merge(args)
            modes.append(measure("on", pool, parent, kids, set(), window, merged))
            meta["opt_in_child_merged"] = opt_in(sandbox_pids(kids[0], BARE_CGROUP))

            set_knob("pages_to_scan", DEFAULT_PAGES_TO_SCAN)
            set_knob("sleep_millisecs", DEFAULT_SLEEP_MS)
            time.sleep(2)
            modes.append(
                measure("on, default rate", pool, parent, kids, set(), args.steady_window, {})
            )

            busy: set[str] = set()
            if args.busy_fraction > 0:
                count = max(1, math.ceil(len(kids) * args.busy_fraction))
                busy = set(kids[:: max(1, len(kids) // count)][:count])
                for cid in sorted(busy):
                    # Started in the background of a shell that exits at once: this runsc's
                    # ``exec -detach`` fails here (its waiter loses the PID: exit 128).
                    pool._runsc(
                        "exec", cid, "/bin/sh", "-c",
                        'python3 -c "$1" "$2" "$3" </dev/null >/dev/null 2>&1 &',
                        "sh", BUSY, str(args.busy_mb), str(args.busy_period),
                    )  # fmt: skip
                time.sleep(args.idle)
                merged = fast_merge(args)
                modes.append(measure("on, 1 in 10 busy", pool, parent, kids, busy, window, merged))
                start = time.perf_counter()
                set_knob("run", 2)
                unmerge_ms = round(ms_since(start))
                set_knob("run", 0)
                time.sleep(args.idle / 2)
                modes.append(
                    measure(
                        "off, 1 in 10 busy", pool, parent, kids, busy, window,
                        {"unmerge_ms": unmerge_ms},
                    )
                )  # fmt: skip
            lb_bare.rm_image(image)
        finally:
            pool.close()
        meta["ksm_after_run"] = counters()
    meta["ksm_restored"] = {
        name: knob(name) for name in ("run", "pages_to_scan", "sleep_millisecs", "pages_sharing")
    }
    return {"meta": meta, "modes": modes}


def markdown(result: dict[str, Any]) -> str:
    modes = result["modes"]
    lines = [
        "| mode | per-child PSS p50 MiB | anon | shmem (memfd) | file | KSM | parent PSS "
        "| pages_sharing / pages_shared | general_profit MiB | ksmd CPU % | child CPU % "
        "| children in 24 GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in modes:
        ksmd = f"{m['ksmd_cpu_pct_window']}"
        if "ksmd_cpu_pct_merging" in m:
            ksmd = f"{m['ksmd_cpu_pct_merging']} merging, {ksmd} after"
        cpu = f"{m['idle_child_cpu_pct_p50']}"
        if m["busy_children"]:
            cpu += f" (busy {m['busy_child_cpu_pct_p50']})"
        pss = f"**{m['child_pss_p50_mib']}**"
        if m["busy_children"]:
            pss += f" (mean {m['child_pss_mean_mib']}, busy {m['busy_child_pss_p50_mib']})"
        lines.append(
            f"| {m['mode']} | {pss} | {m['child_pss_anon_p50_mib']} "
            f"| {m['child_pss_shmem_p50_mib']} | {m['child_pss_file_p50_mib']} "
            f"| {m['child_ksm_p50_mib']} | {m['parent']['pss_mib']} "
            f"| {m['ksm']['pages_sharing']} / {m['ksm']['pages_shared']} "
            f"| {m['ksm']['general_profit_mib']} | {ksmd} | {cpu} | {m['fits_in_24_gib']} |"
        )
    return "\n".join(lines)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # run the finally blocks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=BUNDLE)
    parser.add_argument("--layer", type=Path, default=None, help="default: the base template's")
    parser.add_argument("--children", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="4 children, short windows")
    parser.add_argument("--idle", type=float, default=10.0, help="idle s before measuring")
    parser.add_argument("--window", type=float, default=10.0, help="CPU window, s")
    parser.add_argument("--steady-window", type=float, default=20.0, help="default-rate window")
    parser.add_argument("--scans", type=int, default=2, help="full scans to wait for")
    parser.add_argument("--scan-timeout", type=float, default=180.0)
    parser.add_argument("--pages-to-scan", type=int, default=10000)
    parser.add_argument("--sleep-ms", type=int, default=20)
    parser.add_argument("--busy-fraction", type=float, default=0.1, help="0: no busy modes")
    parser.add_argument("--busy-mb", type=int, default=20)
    parser.add_argument("--busy-period", type=float, default=0.1, help="s between rewrites")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--svg", type=Path, default=None, help="write the density plot here")
    args = parser.parse_args(argv)
    if args.quick:
        args.children, args.idle, args.window, args.steady_window = 4, 4.0, 5.0, 8.0
    if os.geteuid() != 0:
        parser.error("needs root (runsc, /sys/kernel/mm/ksm)")
    signal.signal(signal.SIGTERM, _terminate)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    if args.svg is not None:
        args.svg.write_text(ksm_svg.svg(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
