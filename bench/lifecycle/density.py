"""Part 6: memory of idle sandboxes and of idle fork children."""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

from bench.lifecycle.bare import (
    BareEnvd,
    rm_image,
)
from bench.lifecycle.common import (
    BARE_CGROUP,
    TARGET_CHILD_MIB,
    TARGET_IDLE_MIB,
    Report,
    Row,
    kill_all,
    pss_mib,
    run_true,
)
from bench.lifecycle.fork import (
    node_fork,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.memory import sandbox_pids

# -- 6: density -------------------------------------------------------------------------------


def measure_density(
    report: Report,
    node: LifecycleNode,
    bare: BareEnvd,
    template: Path,
    children: int,
    idle_s: float,
) -> None:
    parent = node.create()
    kids: list[Any] = []
    bare_parent, _ = bare.restore(template)
    bare_kids: list[str] = []
    image: Path | None = None
    try:
        run_true(parent)
        bare.exec(bare_parent, "/bin/true")
        time.sleep(idle_s)
        one = pss_mib(sandbox_pids(parent.sandbox_id))
        bare_one = pss_mib(sandbox_pids(bare_parent, BARE_CGROUP))
        kids = node_fork(node, parent, children).kids
        _, image, _ = bare.checkpoint(bare_parent, leave_running=True)
        for _ in range(children):
            cid, _ = bare.restore(image)
            bare_kids.append(cid)
            bare.exec(cid, "/bin/true")
        time.sleep(idle_s)
        per_kid = [pss_mib(sandbox_pids(k.sandbox_id)) for k in kids]
        per_bare_kid = [pss_mib(sandbox_pids(cid, BARE_CGROUP)) for cid in bare_kids]
        parent_after = pss_mib(sandbox_pids(parent.sandbox_id))
    finally:
        kill_all(kids)
        with contextlib.suppress(Exception):
            parent.kill()
        for cid in [bare_parent, *bare_kids]:
            bare.delete(cid)
        if image is not None:
            rm_image(image)
    total = round(sum(k["pss_mib"] for k in per_kid), 1)
    bare_total = round(sum(k["pss_mib"] for k in per_bare_kid), 1)
    report.memory["density"] = {
        "idle_s": idle_s,
        "one_sandbox": one,
        "parent_after_fork": parent_after,
        "children": per_kid,
        "children_total_pss_mib": total,
        "child_pss_mib_mean": round(total / len(per_kid), 1),
        "child_anon_shmem_mib_mean": round(
            statistics.fmean([k["pss_anon_mib"] + k["pss_shmem_mib"] for k in per_kid]), 1
        ),
        "bare_one_sandbox": bare_one,
        "bare_children": per_bare_kid,
        "bare_children_total_pss_mib": bare_total,
        "bare_child_pss_mib_mean": round(bare_total / len(per_bare_kid), 1),
    }
    report.rows += [
        Row(
            "density",
            "1 idle sandbox (PSS MiB)",
            None,
            unit="MiB",
            value=one["pss_mib"],
            target=TARGET_IDLE_MIB,
            bare_name="bare envd sandbox",
            bare_value=bare_one["pss_mib"],
            issue="idle sandbox memory (PSS MiB, all its host processes)",
            note=f"{one['processes']} processes",
        ),
        Row(
            "density",
            f"{children} idle fork children, total (PSS MiB)",
            None,
            unit="MiB",
            value=total,
            note=f"bare: {bare_total} MiB",
        ),
        Row(
            "density",
            "per fork child (PSS MiB, mean)",
            None,
            unit="MiB",
            value=round(total / len(per_kid), 1),
            target=TARGET_CHILD_MIB,
            bare_name="bare restored child",
            bare_value=round(bare_total / len(per_bare_kid), 1),
            issue="idle fork child memory (PSS MiB, mean)",
            note=f"parent after the fork {parent_after['pss_mib']} MiB",
        ),
    ]
