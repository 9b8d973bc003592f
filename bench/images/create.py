"""Part 3: create from a built template next to create from ``base``, same restore path.

The node runs without a warm pool, so both are plain restores of a memory image: the
benchmark's template (built from the ``debian`` test image, which is the ``base`` template's
tree as an OCI image, plus a COPY and a RUN layer) and the built-in ``base`` template.
Interleaved rounds (template, base) after one warm-up round: ``Sandbox.create(name)`` then
the first ``commands.run("true")``, each timed; the sandbox is killed afterwards (untimed).
The node's ``created`` line gives the phases (rootfs, restore, envd_ready, init).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.images.build import ensure_template
from bench.images.common import Bench, wait_unmounted
from bench.lifecycle_bench import Row, log, run_true
from bench.node_bench.common import ms_since

#: Target from the issue: create from a built template <= 1.2x create from base.
TARGET_RATIO = 1.2
PHASES = ("slot", "rootfs", "restore", "envd_ready", "init")


def create_once(b: Bench, template: str) -> dict[str, Any]:
    node = b.node
    start = time.perf_counter()
    sandbox = node.create(template=template)
    create_ms = ms_since(start)
    try:
        first_ms = run_true(sandbox)
    finally:
        node.kill(sandbox.sandbox_id)
    wait_unmounted(node.server.home, sandbox.sandbox_id)
    return {
        "sandbox_id": sandbox.sandbox_id,
        "create_ms": create_ms,
        "first_command_ms": first_ms,
        "total_ms": create_ms + first_ms,
        "created": node.created().get(sandbox.sandbox_id, {}),
    }


def measure_create(b: Bench, rounds: int) -> None:
    report = b.report
    ensure_template(b)
    for i in range(rounds + 1):  # round 0 is a warm-up
        samples = {
            kind: create_once(b, name)
            for kind, name in (("template", b.template), ("base", "base"))
        }
        log(
            f"  create {i}/{rounds}: template {samples['template']['total_ms']:.0f} ms, "
            f"base {samples['base']['total_ms']:.0f} ms"
        )
        if i == 0:
            continue
        for kind, sample in samples.items():
            report.add(f"create_{kind}", sample)
            for key in ("create_ms", "first_command_ms", "total_ms"):
                report.add(f"create_{kind}_{key}", sample[key])
    phases = {}
    for kind in ("template", "base"):
        mine = [s["created"] for s in report.samples.get(f"create_{kind}", [])]
        phases[kind] = {
            p: round(statistics.median([c[p] for c in mine if p in c]), 1)
            for p in PHASES
            if any(p in c for c in mine)
        }
    report.phases["create"] = phases
    tpl, base = report.lat("create_template_total_ms"), report.lat("create_base_total_ms")
    ratio = round(tpl.p50_ms / base.p50_ms, 2) if tpl and base and base.p50_ms else None

    def text(kind: str) -> str:
        return ", ".join(f"{k} {v:.0f}" for k, v in phases[kind].items())

    report.rows += [
        Row(
            "create",
            "create from built template → first command",
            tpl,
            base,
            "create from base → first command (same run)",
            plot_name="create from template → first command",
        ),
        Row(
            "create",
            "create from template: Sandbox.create()",
            report.lat("create_template_create_ms"),
            report.lat("create_base_create_ms"),
            "base: Sandbox.create()",
            plot=False,
        ),
        Row(
            "create",
            'create from template: first commands.run("true")',
            report.lat("create_template_first_command_ms"),
            report.lat("create_base_first_command_ms"),
            "base: first command",
            plot=False,
        ),
        Row(
            "create",
            f"node log p50 ms, template: {text('template')}; base: {text('base')}",
            None,
            plot=False,
        ),
        Row(
            "create",
            "template / base, create → first command (p50)",
            None,
            target=TARGET_RATIO,
            unit="x",
            value=ratio,
        ),
    ]
