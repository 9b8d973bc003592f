"""Part 3: what a snapshot costs against the bytes a sandbox wrote or changed.

On each node (S3 and posix_fs repository) one sandbox per size writes ``mib`` MiB of random
bytes to /home/user, then is snapshotted ``runs + 1`` times (``create_snapshot()``, round 0 a
warm-up) with nothing changed in between. Per snapshot: the call's time, the node's save and
commit phases (its ``snapshot … (save N ms, commit N ms, … MB)`` line) and the bytes it added
to the repository (``blobs/`` listed before and after, through the store). Then the 64 MiB
sandbox changes 1 MiB of its file (``dd … conv=notrunc`` at a random offset) before each of
``runs`` more snapshots.

Today a sandbox's written files live in its memory (gVisor ``--overlay2=root:memory``), so every
snapshot carries a whole new memory image: its cost follows the bytes written in total, not the
bytes changed since the last snapshot. These rows are the baseline the workspace redesign must
beat. Each snapshot is deleted after it is measured and its memory-image blobs removed from the
store (what the node's GC would do later), so moto's memory and the disk stay bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from aenv.storage.blobs import blob_key
from aenv.storage.manifest import SnapshotManifest
from aenv.storage.objects import ObjectStore
from bench.lifecycle_bench import Report, log, p50, run_true
from bench.node_bench.common import ms_since
from bench.repository.common import BACKENDS, MIB, SNAPSHOT_RE, RepoNode, SizedRow

SIZES_MIB = (0, 16, 64, 256)
CHANGED_OF_MIB = 64
WRITE = "head -c {mib}M /dev/urandom > /home/user/blob && sync"
CHANGE = "dd if=/dev/urandom of=/home/user/blob bs=1M count=1 seek={at} conv=notrunc && sync"


async def _drop_image_blobs(node: RepoNode, snapshot_id: str) -> None:
    store = ObjectStore(node.location)
    raw = await store.get_bytes(f"manifests/{snapshot_id}.json")
    manifest = SnapshotManifest.model_validate_json(raw)
    for ref in manifest.memory:
        await store.delete(blob_key(ref.digest))


def snapshot_once(node: RepoNode, sandbox: Any) -> dict[str, float]:
    from e2b import Sandbox

    before = node.blob_bytes()
    start = time.perf_counter()
    info = sandbox.create_snapshot()
    out = {"snapshot": ms_since(start)}
    out["added_mib"] = (node.blob_bytes() - before) / MIB
    line = node.wait_line(SNAPSHOT_RE, lambda m: m["snap"] == info.snapshot_id, 0, 10)
    if line is not None:
        out |= {
            "save": float(line["save"]),
            "commit": float(line["commit"]),
            "image_mib": float(line["mb"]) * 1e6 / MIB,
        }
    asyncio.run(_drop_image_blobs(node, info.snapshot_id))
    Sandbox.delete_snapshot(info.snapshot_id, **node.opts())
    return out


def _record(report: Report, key: str, sample: dict[str, float]) -> None:
    for name, value in sample.items():
        report.add(f"{key}_{name}", value)


def measure_cost(
    report: Report, nodes: dict[str, RepoNode], runs: int, sizes: tuple[int, ...] = SIZES_MIB
) -> None:
    for backend in BACKENDS:
        node = nodes[backend]
        for mib in sizes:
            sandbox = node.create()
            try:
                if mib:
                    sandbox.commands.run(WRITE.format(mib=mib), timeout=300)
                run_true(sandbox)
                for i in range(runs + 1):
                    sample = snapshot_once(node, sandbox)
                    if i:
                        _record(report, f"cost_{backend}_{mib}", sample)
                log(
                    f"  {backend} snapshot, {mib} MiB written: p50 "
                    f"{p50(report.samples[f'cost_{backend}_{mib}_snapshot'])} ms, adds "
                    f"{p50(report.samples[f'cost_{backend}_{mib}_added_mib'])} MiB"
                )
                if mib != CHANGED_OF_MIB:
                    continue
                for _ in range(runs):
                    at = random.randrange(mib)
                    sandbox.commands.run(CHANGE.format(at=at), timeout=60)
                    run_true(sandbox)
                    _record(report, f"cost_{backend}_changed", snapshot_once(node, sandbox))
                log(
                    f"  {backend} snapshot, 1 of {mib} MiB changed: p50 "
                    f"{p50(report.samples[f'cost_{backend}_changed_snapshot'])} ms, adds "
                    f"{p50(report.samples[f'cost_{backend}_changed_added_mib'])} MiB"
                )
            finally:
                node.kill(sandbox.sandbox_id)
    for backend in BACKENDS:
        for mib in sizes:
            _rows(report, backend, f"cost_{backend}_{mib}", f"{mib} MiB written")
            if mib == CHANGED_OF_MIB:
                _rows(
                    report,
                    backend,
                    f"cost_{backend}_changed",
                    f"{mib} MiB written, then 1 MiB changed",
                )


def _rows(report: Report, backend: str, key: str, what: str) -> None:
    added = p50(report.samples.get(f"{key}_added_mib", []))
    image = p50(report.samples.get(f"{key}_image_mib", []))
    save, commit = (p50(report.samples.get(f"{key}_{k}", [])) for k in ("save", "commit"))
    report.sizes[key] = {
        "added_mib_p50": added,
        "image_mib_p50": image,
        "save_ms_p50": save,
        "commit_ms_p50": commit,
    }
    report.rows.append(
        SizedRow(
            "cost",
            f"{backend}: snapshot, {what}",
            report.lat(f"{key}_snapshot"),
            report.lat(f"{key}_save"),
            "of which: save (runsc checkpoint)",
            mib=added,
            note=f"adds {added} MiB to the repository; image {image} MiB; commit p50 {commit} ms",
            plot_name=f"{backend} snapshot, {what}",
        )
    )
