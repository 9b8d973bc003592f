"""Part 1: create from the template, and the first command."""

from __future__ import annotations

import time
from pathlib import Path

from bench.lifecycle.bare import (
    BareEnvd,
)
from bench.lifecycle.common import (
    TARGET_CREATE_MS,
    WARM_READY_RE,
    Report,
    Row,
    log,
    p50,
    run_true,
)
from bench.lifecycle.node import (
    LifecycleNode,
)
from bench.node_bench.common import ms_since

# -- 1: create from template ------------------------------------------------------------------


def measure_create(
    report: Report, node: LifecycleNode, bare: BareEnvd, template: Path, runs: int
) -> None:
    for i in range(runs + 1):  # round 0 is a warm-up
        if not node.wait_pool_full():
            report.errors.append("create: warm pool not refilled within 120 s")
        sandbox = None
        kill_ms = 0.0
        try:
            start = time.perf_counter()
            sandbox = node.create()
            create_ms = ms_since(start)
            first_ms = run_true(sandbox)
        finally:
            if sandbox is not None:
                start = time.perf_counter()
                sandbox.kill()
                kill_ms = ms_since(start)
        node.wait_pool_full()
        cid, restore_ms = bare.restore(template)
        try:
            exec_ms = bare.exec(cid, "/bin/true")
        finally:
            start = time.perf_counter()
            bare.delete(cid)
            delete_ms = ms_since(start)
        if i == 0:
            continue
        report.add("create_call", create_ms)
        report.add("create_first_command", first_ms)
        report.add("create_total", create_ms + first_ms)
        report.add("create_ids", sandbox.sandbox_id)
        report.add("bare_restore", restore_ms)
        report.add("bare_restore_exec", exec_ms)
        report.add("bare_restore_total", restore_ms + exec_ms)
        report.add("kill", kill_ms)
        report.add("bare_delete", delete_ms)
        log(
            f"  create {i}/{runs}: {create_ms:.0f}+{first_ms:.0f} ms, "
            f"bare restore {restore_ms:.0f}+{exec_ms:.0f} ms"
        )
    created = node.created()
    mine = [created[s] for s in report.samples.get("create_ids", []) if s in created]
    report.phases["create"] = {
        "from_pool": sum(int(c["warm"]) for c in mine),
        "of": len(mine),
        "server_total_p50_ms": p50([c["total"] for c in mine]),
        "init_p50_ms": p50([c["init"] for c in mine if "init" in c]),
        "warm_restore_p50_ms": p50([float(m["ms"]) for m in node.matches(WARM_READY_RE)]),
    }
    bare_total = report.lat("bare_restore_total", "bare: restore -detach + first exec true")
    report.rows += [
        Row(
            "create",
            "create from template: Sandbox.create()",
            report.lat("create_call"),
            bare_total,
            "restore -detach + first exec",
            TARGET_CREATE_MS,
        ),
        Row(
            "create",
            'create: first commands.run("true")',
            report.lat("create_first_command"),
            report.lat("bare_restore_exec"),
            "first exec true",
            plot=False,
        ),
        Row(
            "create",
            "create → first command answered",
            report.lat("create_total"),
            bare_total,
            "restore -detach + first exec",
            TARGET_CREATE_MS,
            issue="create → first command answered",
        ),
        Row(
            "create",
            "kill → answered: Sandbox.kill()",
            report.lat("kill"),
            report.lat("bare_delete"),
            "runsc delete --force (and its cgroups, overlay)",
            plot=False,
        ),
    ]
