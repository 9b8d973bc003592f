"""Part 3: snapshots of a running sandbox with 0, 10 and 50 MiB written."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from bench.lifecycle.bare import (
    BareEnvd,
    rm_image,
)
from bench.lifecycle.common import (
    SNAPSHOT_RE,
    TARGET_SNAPSHOT_MS,
    TARGET_SNAPSHOT_RATIO,
    Report,
    Row,
    log,
    p50,
    run_true,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.common import MIB, ms_since

# -- 3: snapshots -----------------------------------------------------------------------------


WRITE = "head -c {mib}M /dev/urandom > /home/user/blob-{mib} && sync"


def measure_snapshot(
    report: Report, node: LifecycleNode, bare: BareEnvd, template: Path, sizes: list[int], runs: int
) -> None:
    from e2b import Sandbox

    for mib in sizes:
        sandbox = node.create()
        bare_id, _ = bare.restore(template)
        try:
            if mib:
                sandbox.commands.run(WRITE.format(mib=mib), timeout=120)
                bare.exec(bare_id, "/bin/sh", "-c", WRITE.format(mib=mib))
            run_true(sandbox)
            for i in range(runs + 1):
                start = time.perf_counter()
                info = sandbox.create_snapshot()
                snap_ms = ms_since(start)
                snap = info.snapshot_id
                line = node.wait_line(SNAPSHOT_RE, lambda m: m["snap"] == snap, 0, 10)  # noqa: B023
                Sandbox.delete_snapshot(info.snapshot_id, **node.opts())
                b_ms, image, b_bytes = bare.checkpoint(bare_id, leave_running=True)
                rm_image(image)
                s_ms, image, _ = bare.checkpoint_socket(bare_id)
                rm_image(image)
                if i == 0:
                    continue
                report.add(f"bare_socket_snapshot_{mib}", s_ms)
                report.add(f"snapshot_{mib}", snap_ms)
                report.add(f"bare_snapshot_{mib}", b_ms)
                report.add(f"bare_snapshot_{mib}_mib", b_bytes / MIB)
                if line is not None:
                    report.add(f"snapshot_{mib}_server", float(line["total"]))
                    report.add(f"snapshot_{mib}_save", float(line["save"]))
                    report.add(f"snapshot_{mib}_mib", float(line["mb"]) * 1e6 / MIB)
            log(
                f"  snapshot {mib} MiB: p50 {p50(report.samples[f'snapshot_{mib}'])} ms "
                f"(bare {p50(report.samples[f'bare_snapshot_{mib}'])} ms, over the control "
                f"socket {p50(report.samples[f'bare_socket_snapshot_{mib}'])} ms), "
                f"{p50(report.samples.get(f'snapshot_{mib}_mib', []))} MiB"
            )
        finally:
            with contextlib.suppress(Exception):
                sandbox.kill()
            bare.delete(bare_id)
        size = p50(report.samples.get(f"snapshot_{mib}_mib", []))
        bare_size = p50(report.samples.get(f"bare_snapshot_{mib}_mib", []))
        report.sizes[f"snapshot_{mib}_mib_p50"] = size
        report.sizes[f"bare_snapshot_{mib}_mib_p50"] = bare_size
        report.phases[f"snapshot_{mib}"] = {
            "server_total_p50_ms": p50(report.samples.get(f"snapshot_{mib}_server", [])),
            "save_p50_ms": p50(report.samples.get(f"snapshot_{mib}_save", [])),
        }
        report.rows.append(
            Row(
                "snapshot",
                f"snapshot, {mib} MiB written: create_snapshot()",
                report.lat(f"snapshot_{mib}"),
                report.lat(f"bare_snapshot_{mib}"),
                "checkpoint --leave-running",
                TARGET_SNAPSHOT_MS,
                issue="snapshot, source keeps running, 10 MiB written" if mib == 10 else "",
                note=f"{size} MiB image (bare {bare_size} MiB)",
            )
        )
        node_p50 = p50(report.samples.get(f"snapshot_{mib}", []))
        socket_p50 = p50(report.samples.get(f"bare_socket_snapshot_{mib}", []))
        report.rows.append(
            Row(
                "snapshot",
                f"snapshot, {mib} MiB written: create_snapshot() / the bare control-socket "
                f"checkpoint (p50 {socket_p50} ms)",
                None,
                target=TARGET_SNAPSHOT_RATIO,
                unit="x",
                value=round(node_p50 / socket_p50, 2) if node_p50 and socket_p50 else None,
                plot=False,
            )
        )
