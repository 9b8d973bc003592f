"""Part 4: fork x1, x4, x16 until every child answered a command."""

from __future__ import annotations

import contextlib
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lifecycle.bare import (
    BareEnvd,
    rm_image,
)
from bench.lifecycle.common import (
    FORK_RE,
    REQUEST_TIMEOUT_S,
    SANDBOX_TIMEOUT_S,
    TARGET_FORK16_MS,
    Report,
    Row,
    _p50,
    kill_all,
    log,
    p50,
    run_true,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.common import NODE_CGROUP, cgroup_cpu_ms, ms_since

# -- 4: fork ----------------------------------------------------------------------------------


@dataclass
class ForkRun:
    """One ``fork(count)`` until every child answered a command."""

    call_ms: float
    all_ms: float
    kids: list[Any]
    #: Each child's first ``commands.run("true")`` (ms), and its cgroup's CPU (ms) by then.
    first_ms: list[float]
    cpu_ms: list[float]


def node_fork(node: LifecycleNode, parent: Any, count: int, first_timeout: float = 60.0) -> ForkRun:
    start = time.perf_counter()
    children = parent.fork(
        count=count, timeout=SANDBOX_TIMEOUT_S, request_timeout=REQUEST_TIMEOUT_S
    )
    call_ms = ms_since(start)
    kids = [c for c in children if not isinstance(c, Exception)]
    failed = [c for c in children if isinstance(c, Exception)]
    try:
        if failed:
            raise RuntimeError(f"{len(failed)} of {count} fork children failed: {failed[0]!r}")
        with ThreadPoolExecutor(count) as pool:
            first = list(pool.map(lambda kid: run_true(kid, first_timeout), kids))
        all_ms = ms_since(start)
        cpu = [cgroup_cpu_ms(f"{NODE_CGROUP}/{k.sandbox_id}") for k in kids]
        return ForkRun(call_ms, all_ms, kids, first, [c for c in cpu if c is not None])
    except BaseException:
        kill_all(kids)
        raise


def bare_fork(
    bare: BareEnvd, parent: str, count: int, precreated: bool = False
) -> tuple[float, float]:
    """Bare: checkpoint --leave-running + ``count`` concurrent restores + exec true each:
    (checkpoint ms, all answered ms). Children deleted afterwards (untimed). ``precreated``:
    each child is ``runsc create``d before the clock starts and restored into."""
    # rootfs + bundle (+ runsc create), untimed
    prepared = [bare.precreate() if precreated else bare.prepare_restore() for _ in range(count)]
    image: Path | None = None

    def child(slot: tuple[str, Path]) -> None:
        assert image is not None
        bare.restore(image, slot)
        bare.exec(slot[0], "/bin/true")

    try:
        start = time.perf_counter()
        ckpt_ms, image, _ = bare.checkpoint(parent, leave_running=True)
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(child, prepared))
        return ckpt_ms, ms_since(start)
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(bare.delete, [cid for cid, _ in prepared]))
        if image is not None:
            rm_image(image)


def fork_phases(node: LifecycleNode, kids_by_run: list[list[str]]) -> dict[str, Any]:
    """The children's ``created`` phases: p50 over all children, and p50 of each run's max."""
    created = node.created()
    per_child = [created[k] for run in kids_by_run for k in run if k in created]
    names = [
        k
        for k in ("slot", "rootfs", "restore", "envd_ready", "init")
        if any(k in c for c in per_child)
    ]
    out: dict[str, Any] = {
        "child_p50_ms": {k: p50([c[k] for c in per_child if k in c]) for k in names}
    }
    out["slowest_child_p50_ms"] = {
        k: p50(
            [
                max(created[c].get(k, 0) for c in run if c in created)
                for run in kids_by_run
                if any(c in created for c in run)
            ]
        )
        for k in names
    }
    return out


def measure_fork(
    report: Report,
    node: LifecycleNode,
    bare: BareEnvd,
    template: Path,
    counts: dict[int, int],
    warmup: bool = True,
    prefix: str = "",
) -> None:
    """Fork x N of one sandbox, each run interleaved with the bare equivalents (for x16 also
    into pre-created bare sandboxes). Before each timed fork the node's pre-created pool is
    refilled (from the log: as many made since the last fork as it took; a parent of the
    template's shape, as here, keeps the pool's shape; disk-workspace forks take none). ``prefix``
    keys the samples of a second node (its rows are labelled with its workspace mode)."""
    parent = node.create()
    pid = parent.sandbox_id
    bare_parent, _ = bare.restore(template)
    mode = f"{node.workspace} workspaces"
    since, needed = node.precreated_made(), 0
    try:
        run_true(parent)
        bare.exec(bare_parent, "/bin/true")
        for count, runs in counts.items():
            kids_by_run: list[list[str]] = []
            before = node.count(FORK_RE, lambda m: m["id"] == pid)
            for i in range(runs + (1 if warmup and count == min(counts) else 0)):
                if not node.wait_precreated(since, needed):
                    report.errors.append(
                        f"{prefix}fork x{count}: pre-created pool not refilled ({needed}) "
                        "within 120 s"
                    )
                since = node.precreated_made()
                run = node_fork(node, parent, count)
                call_ms, all_ms, kids = run.call_ms, run.all_ms, run.kids
                created = node.created()
                taken = sum(
                    int(created.get(k.sandbox_id, {}).get("from_precreated", 0)) for k in kids
                )
                needed = taken
                # Idle children cost ~5 % of a core each: gone before the bare runs.
                kill_all(kids)
                b_ckpt, b_all = bare_fork(bare, bare_parent, count)
                b_pre = (
                    bare_fork(bare, bare_parent, count, precreated=True)[1] if count == 16 else 0
                )
                if warmup and count == min(counts) and i == 0:
                    before += 1
                    continue
                kids_by_run.append([k.sandbox_id for k in kids])
                report.add(f"{prefix}fork_{count}_call", call_ms)
                report.add(f"{prefix}fork_{count}_all", all_ms)
                report.add(f"{prefix}fork_{count}_precreated_children", taken)
                report.add(f"{prefix}fork_{count}_first_command_max", max(run.first_ms))
                report.add(f"{prefix}fork_{count}_child_cpu", statistics.fmean(run.cpu_ms or [0.0]))
                report.add(f"{prefix}bare_fork_{count}", b_all)
                report.add(f"{prefix}bare_fork_{count}_checkpoint", b_ckpt)
                if count == 16:
                    report.add(f"{prefix}bare_fork_{count}_precreated", b_pre)
                log(
                    f"  fork x{count} ({mode}) {len(kids_by_run)}/{runs}: call {call_ms:.0f}, "
                    f"all answered {all_ms:.0f} ms ({taken} children pre-created); bare "
                    f"{b_all:.0f} ms (checkpoint {b_ckpt:.0f})"
                    + (f", into pre-created {b_pre:.0f} ms" if count == 16 else "")
                )
            key = f"{prefix}fork_{count}"
            lines = [m for m in node.matches(FORK_RE) if m["id"] == pid][before:]
            report.phases[key] = {
                "workspace": node.workspace,
                "server_total_p50_ms": p50([float(m["total"]) for m in lines]),
                "checkpoint_p50_ms": p50([float(m["checkpoint"]) for m in lines]),
                "bare_checkpoint_p50_ms": p50(
                    report.samples[f"{prefix}bare_fork_{count}_checkpoint"]
                ),
                "precreated_children_p50": _p50(report, f"{key}_precreated_children"),
                "first_command_slowest_p50_ms": _p50(report, f"{key}_first_command_max"),
                "child_cpu_mean_p50_ms": _p50(report, f"{key}_child_cpu"),
                **fork_phases(node, kids_by_run),
            }
            row = f"fork x{count} → all children answered ({runs} runs, {mode})"
            report.rows.append(
                Row(
                    "fork" if not prefix else "fork-" + node.workspace,
                    row,
                    report.lat(f"{key}_all"),
                    report.lat(f"{prefix}bare_fork_{count}"),
                    f"checkpoint + {count} restore + exec",
                    TARGET_FORK16_MS if count == 16 else None,
                    issue=f"fork x16 → all 16 answered ({mode})" if count == 16 else "",
                    note=f"fork() call alone p50 {p50(report.samples[f'{key}_call'])} ms",
                )
            )
            if count == 16:
                report.rows.append(
                    Row(
                        "fork" if not prefix else "fork-" + node.workspace,
                        row + ", bare into pre-created",
                        report.lat(f"{key}_all"),
                        report.lat(f"{prefix}bare_fork_{count}_precreated"),
                        f"checkpoint + {count} restore into runsc-created + exec",
                        TARGET_FORK16_MS,
                        plot=False,
                        issue=f"fork x16 → all 16 answered ({mode})",
                    )
                )
    finally:
        with contextlib.suppress(Exception):
            parent.kill()
        bare.delete(bare_parent)
