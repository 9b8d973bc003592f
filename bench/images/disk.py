"""Part 4: disk used by many sandboxes of one image.

N sandboxes (default 50) are created from the benchmark's template (the ``debian`` test
image + a COPY and a RUN layer), in batches of a few concurrent ``Sandbox.create`` calls; each
then writes 1 MiB to its home directory (``head -c 1M /dev/urandom > ~/blob``), so the
question "where do a sandbox's writes go" has an answer to measure. ``du`` (allocated bytes,
each inode once) of the template's layers, of ``<home>/sandboxes`` (each sandbox's overlay
upper, work dir and record) and of ``<home>/runtime`` (runsc state and bundles), before the
first create, with all N alive, and after they were killed; the memory cgroup's usage of each
sandbox while alive. The naive equivalent is N private copies of the unpacked image.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.images.build import ensure_template
from bench.images.common import MIB, Bench, du_bytes, memcg_bytes
from bench.lifecycle_bench import Row, kill_all, log
from bench.node_bench.common import ms_since

WRITE = "head -c 1048576 /dev/urandom > ~/blob && sync"


def _stat(label: str, unit: str, value: float) -> Row:
    """One measured size or duration of the disk part (it has no bare equivalent)."""
    return Row("disk", label, None, unit=unit, value=value)


def _usage(b: Bench, template_layers: list[Path]) -> dict[str, int]:
    home = b.node.server.home
    image_layers = [b.node.layer(i) for i in b.images["debian"].layer_ids]
    own = [p for p in template_layers if p not in image_layers]
    uppers = sorted((home / "sandboxes").glob("*/upper"))
    return {
        "image_layers": du_bytes(*image_layers),
        "template_layers": du_bytes(*own),
        "sandboxes_dir": du_bytes(home / "sandboxes"),
        "uppers": du_bytes(*uppers),
        "upper_count": len(uppers),
        "runtime_dir": du_bytes(home / "runtime"),
        "repository": du_bytes(home / "repository"),
        "blobs": du_bytes(home / "blobs"),
    }


def measure_disk(b: Bench, count: int, batch: int) -> None:
    report = b.report
    ensure_template(b)
    node = b.node
    probe = node.create(template=b.template)
    try:
        template_layers = node.lowers(probe.sandbox_id)
    finally:
        probe.kill()
    before = _usage(b, template_layers)
    sandboxes: list[Any] = []

    def one() -> Any:
        sandbox = node.create(template=b.template)
        sandboxes.append(sandbox)
        result = sandbox.commands.run(WRITE, timeout=120, request_timeout=120)
        if result.exit_code != 0:
            raise RuntimeError(f"write in {sandbox.sandbox_id} exited {result.exit_code}")
        return sandbox

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(batch) as pool:
            for first in range(0, count, batch):
                list(pool.map(lambda _: one(), range(first, min(count, first + batch))))
                log(f"  disk: {len(sandboxes)}/{count} sandboxes up ({ms_since(started):.0f} ms)")
        wall_ms = ms_since(started)
        alive = _usage(b, template_layers)
        memcg = [m for s in sandboxes if (m := memcg_bytes(s.sandbox_id)) is not None]
        uppers = [
            du_bytes(node.server.home / "sandboxes" / s.sandbox_id / "upper") for s in sandboxes
        ]
    finally:
        kill_all(sandboxes)
    time.sleep(1)
    after = _usage(b, template_layers)
    n = len(sandboxes)
    per = {key: (alive[key] - before[key]) / n for key in ("sandboxes_dir", "runtime_dir")}
    report.sizes["disk"] = {
        "sandboxes": n,
        "batch": batch,
        "create_wall_ms": round(wall_ms),
        "before": before,
        "alive": alive,
        "after_kill": after,
        "upper_bytes": uppers,
        "memcg_bytes": memcg,
        "per_sandbox_bytes": per,
        "write_per_sandbox_bytes": MIB,
    }
    image = b.images["debian"]
    upper_p50 = statistics.median(uppers) if uppers else 0
    report.sizes["disk"]["sandbox_total_bytes"] = per["sandboxes_dir"] + per["runtime_dir"]
    disk_alive = (
        alive["image_layers"]
        + alive["template_layers"]
        + alive["sandboxes_dir"]
        + alive["runtime_dir"]
    )
    report.rows += [
        _stat(
            f"the image: {image.blob_bytes / MIB:.1f} MiB compressed, unpacked on disk",
            "MiB",
            round(before["image_layers"] / MIB, 1),
        ),
        _stat(
            "the template's own layers (COPY, RUN)",
            "KiB",
            round(before["template_layers"] / 1024, 1),
        ),
        _stat(
            "compressed blobs the node keeps after unpacking (<home>/blobs)",
            "MiB",
            round(before["blobs"] / MIB, 1),
        ),
        _stat(
            "memory images (<home>/repository: base + the template)",
            "MiB",
            round(before["repository"] / MIB, 1),
        ),
        _stat(
            f"{n} sandboxes: created and 1 MiB written in each (wall, batches of {batch})",
            "s",
            round(wall_ms / 1000, 1),
        ),
        _stat(
            f"image + template layers with {n} sandboxes alive (before: "
            f"{(before['image_layers'] + before['template_layers']) / MIB:.1f} MiB)",
            "MiB",
            round((alive["image_layers"] + alive["template_layers"]) / MIB, 1),
        ),
        _stat(
            f"overlay upper per sandbox (p50; max {max(uppers, default=0) / 1024:.0f} KiB)",
            "KiB",
            round(upper_p50 / 1024, 1),
        ),
        _stat(
            "<home>/sandboxes per sandbox (upper, work, record)",
            "KiB",
            round(per["sandboxes_dir"] / 1024, 1),
        ),
        _stat(
            "<home>/runtime per sandbox (runsc state, bundle, logs)",
            "KiB",
            round(per["runtime_dir"] / 1024, 1),
        ),
        _stat(
            "disk per sandbox beyond the shared layers (sandboxes + runtime)",
            "KiB",
            round((per["sandboxes_dir"] + per["runtime_dir"]) / 1024, 1),
        ),
        _stat(
            f"disk of all {n} sandboxes: image + layers + sandboxes + runtime "
            f"(naive: {n} copies of the image = {n * before['image_layers'] / MIB:.0f} MiB)",
            "MiB",
            round(disk_alive / MIB, 1),
        ),
        _stat(
            "memory cgroup usage per sandbox, p50 (the 1 MiB write lives here)",
            "MiB",
            round(statistics.median(memcg) / MIB, 1) if memcg else None,
        ),
        _stat(
            f"after killing them: uppers left {after['upper_count']}, <home>/sandboxes",
            "KiB",
            round(after["sandboxes_dir"] / 1024, 1),
        ),
    ]
