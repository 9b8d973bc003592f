"""Where the time goes, and the markdown report."""

from __future__ import annotations

import json

from bench.header import environment, load_line
from bench.lifecycle.common import (
    PAUSE_HOT_S,
    REPO,
    TARGET_PROXY_RATIO,
    Report,
    Row,
    _fmt,
    _p50,
)

# -- where the time goes ----------------------------------------------------------------------


def explain(report: Report) -> None:
    """A short note for each missed target, from the node's own phase log lines."""
    missed = [r for r in report.rows if r.passed is False]
    ph = report.phases

    def miss(part: str, prefix: str) -> bool:
        return any(r.part == part and r.name.startswith(prefix) for r in missed)

    if miss("create", "create from template") and "create" in ph:
        c = ph["create"]
        report.where.append(
            f"create: {c['from_pool']}/{c['of']} creates were served by the warm pool; the "
            f"node's own share (claim + envd /init + store update) is {c['init_p50_ms']} ms "
            f"p50; the rest of the {_p50(report, 'create_call')} ms is the SDK's HTTP request "
            f"and the API layer. Refilling the pool restores a sandbox in the background "
            f"({c['warm_restore_p50_ms']} ms p50), on the same 2 cores as the first command."
        )
    if miss("pause", "pause (API"):
        report.where.append(
            f"pause: {_p50(report, 'pause_hot')} ms p50 for the API call vs "
            f"{_p50(report, 'bare_pause')} ms for a bare `runsc pause` (CLI: spawn, urpc, "
            "state file); the node adds the quiesce (close streams and pooled connections, "
            "20 ms settle) and two store updates. The server logs no phases for a hot pause."
        )
    if miss("pause", "resume hot"):
        report.where.append(
            f"resume hot: connect {_p50(report, 'resume_hot')} ms p50, of which the node logs "
            f"{_p50(report, 'resume_hot_server')} ms (a `runsc resume` CLI call: bare "
            f"{_p50(report, 'bare_resume')} ms, and the store update); the rest is the HTTP "
            "request, the record lookup and the response."
        )
    if miss("pause", "resume from disk"):
        phases = ", ".join(
            f"{key.removeprefix('resume_disk_phase_')} {_p50(report, key)}"
            for key in report.samples if key.startswith("resume_disk_phase_"))
        report.where.append(
            f"resume from disk: connect {_p50(report, 'resume_disk')} ms p50; the node logs "
            f"{_p50(report, 'resume_disk_server')} ms (p50 per phase, ms: {phases}; `ready`: "
            "restored into the runtime sandbox made ahead on its disk); a bare `restore "
            f"-detach` of the same kind of image takes {_p50(report, 'bare_restore_resume')} ms "
            f"fresh, {_p50(report, 'bare_restore_resume_precreated')} ms into a sandbox "
            "created ahead: restore is CPU-bound (seccomp filter build + decoding the kernel "
            "state) on 2 cores."
        )
    for row in missed:
        if row.part != "snapshot":
            continue
        key = row.name.split(" MiB")[0].replace("snapshot, ", "snapshot_")
        values = ph.get(key, {})
        report.where.append(
            f"{row.name.split(':')[0]}: API {_p50(report, key)} ms p50 = node "
            f"{values.get('server_total_p50_ms')} ms (checkpoint with quiesce "
            f"{values.get('save_p50_ms')} ms, then the repository commit) + HTTP; a bare "
            f"`checkpoint --leave-running` of the same content takes "
            f"{_p50(report, 'bare_' + key)} ms ({report.sizes.get('bare_' + key + '_mib_p50')} "
            "MiB written uncompressed)."
        )
    for row in missed:
        if row.part != "fork" or row.name.endswith("bare into pre-created"):
            continue
        key = "fork_" + row.name.split()[1].removeprefix("x")
        f = ph.get(key, {})
        child, slow = f.get("child_p50_ms", {}), f.get("slowest_child_p50_ms", {})
        report.where.append(
            f"fork x{key.removeprefix('fork_')}: {_p50(report, key + '_all')} ms p50 until all "
            f"answered; node: checkpoint {f.get('checkpoint_p50_ms')} ms (bare "
            f"{f.get('bare_checkpoint_p50_ms')} ms), then per child (p50 / slowest child, p50 "
            "over runs) "
            + ", ".join(f"{k} {child.get(k)} / {slow.get(k)}" for k in child)
            + " ms. The children are restored concurrently and restores are CPU-bound (~150 "
            "ms CPU each, ~10/s on 2 cores, RUNTIME-NOTES); bare runsc needs "
            f"{_p50(report, 'bare_' + key)} ms for the same."
        )
    seen: set[str] = set()
    for row in missed:
        kind = "fork4" if row.name.startswith("fork") else "snapshot"
        if row.part != "aging" or kind in seen:
            continue
        seen.add(kind)
        extra = ""
        if kind == "fork4":
            ctl, aged = ph.get("aging_control_fork4", {}), ph.get("aging_aged_fork4", {})
            extra = (
                "; fork x4 of the control → the aged sandbox (p50, interleaved): fork() call "
                f"{ctl.get('fork_call_p50_ms')} → {aged.get('fork_call_p50_ms')} ms, per child "
                + ", ".join(
                    f"{k} {ctl.get('child_p50_ms', {}).get(k)} → "
                    f"{aged.get('child_p50_ms', {}).get(k)}"
                    for k in aged.get("child_p50_ms", {})
                )
                + f" ms; checkpoint {_p50(report, 'aging_control_fork4_checkpoint')} → "
                f"{_p50(report, 'aging_aged_fork4_checkpoint')} ms; slowest child's first "
                f"command {ctl.get('first_command_slowest_p50_ms')} → "
                f"{aged.get('first_command_slowest_p50_ms')} ms; CPU per child until it "
                f"answered {ctl.get('child_cpu_mean_p50_ms')} → "
                f"{aged.get('child_cpu_mean_p50_ms')} ms"
            )
        report.where.append(
            f"aging ({row.name.split(':')[0]}): image "
            f"{report.sizes.get('aging_fresh_snapshot_mib_p50')} MiB fresh vs "
            f"{report.sizes.get('aging_aged_snapshot_mib_p50')} MiB aged{extra}; load average "
            f"{report.phases.get('aging', {}).get('load_fresh')} when the fresh probes started, "
            f"{report.phases.get('aging', {}).get('load_aged')} when the aged ones did."
        )


#: Issue 11's table, in its order (rows carry these labels in ``Row.issue``; a label ending in
#: "(" matches every workspace mode measured).
ISSUE_ROWS = (
    "create → first command answered",
    "resume from disk (connect)",
    "snapshot, source keeps running, 10 MiB written",
    "fork x16 → all 16 answered (",
    "idle sandbox memory (PSS MiB, all its host processes)",
    "idle fork child memory (PSS MiB, mean)",
    "idle sandbox CPU (% of one core)",
    'commands.run("true") round trip (SDK, warm sandbox)',
    "proxy requests/s",
)
PROXY_RESULTS = REPO / "bench" / "results" / "proxy.json"


def proxy_row() -> Row:
    """bench/proxy_bench.py's proxy/straight req/s (envd /health), read from its results file
    if it was run; that benchmark measures it, not this one."""
    note = "from bench/results/proxy.json (bench/proxy_bench.py)"
    try:
        median = json.loads(PROXY_RESULTS.read_text())["median"]
        by_path = next(v for k, v in median.items() if k.startswith("envd")) or {}
        ratio = round(by_path["proxy"]["rps"] / by_path["straight"]["rps"], 2)
    except (OSError, ValueError, KeyError, StopIteration, ZeroDivisionError):
        return Row(
            "proxy",
            "proxy requests/s: not measured here",
            None,
            issue=ISSUE_ROWS[-1],
            note="run bench/proxy_bench.py (bench/results/proxy.json)",
        )
    return Row(
        "proxy",
        "proxy req/s / straight req/s",
        None,
        bare_name="straight to the guest",
        target=TARGET_PROXY_RATIO,
        at_least=True,
        unit="x",
        value=ratio,
        issue=ISSUE_ROWS[-1],
        note=f"{by_path['proxy']['rps']:.0f} vs {by_path['straight']['rps']:.0f} req/s; {note}",
    )


def headline(report: Report) -> list[Row]:
    """The rows of issue 11's table, in its order (missing ones as empty rows)."""
    rows: list[Row] = []
    for label in ISSUE_ROWS:
        if label == ISSUE_ROWS[-1]:
            rows.append(proxy_row())
            continue
        found = [
            r
            for r in report.rows
            if r.issue == label or (label.endswith("(") and r.issue.startswith(label))
        ]
        rows += found or [Row("missing", f"{label}: not measured", None, issue=label)]
    return rows


def table(rows: list[Row], with_issue: bool = False) -> list[str]:
    lines = [
        ("| issue 11 operation " if with_issue else "")
        + "| Operation | n | p50 | p95 | bare equivalent | bare p50 / p95 "
        "| ratio | target | pass/miss |",
        ("|---" if with_issue else "") + "|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for r in rows:
        lat, bare = r.latency, r.bare
        suffix = f" {r.unit}" if r.unit not in ("ms", "x") else ""
        if lat is not None:
            n, a, b = str(lat.n), _fmt(lat.p50_ms) + " ms", _fmt(lat.p95_ms) + " ms"
        else:
            n, b = "", ""
            a = _fmt(r.value, r.unit) + (suffix if r.value is not None else "")
        if bare:
            bare_text = f"{_fmt(bare.p50_ms)} / {_fmt(bare.p95_ms)} ms"
        else:
            bare_text = _fmt(r.bare_value, r.unit) + (suffix if r.bare_value is not None else "")
        base = bare.p50_ms if bare else r.bare_value
        ratio = f"{r.measured / base:.2f}x" if r.measured is not None and base else ""
        target = ""
        if r.target is not None:
            target = (
                (">= " if r.at_least else "<= ")
                + f"{r.target:g}"
                + ({"ms": " ms", "MiB": " MiB", "%": " %"}.get(r.unit, "x"))
            )
        mark = {True: "pass", False: "**miss**", None: ""}[r.passed]
        name = r.name + (f" ({r.note})" if r.note else "")
        lines.append(
            (f"| {r.issue} " if with_issue else "")
            + f"| {name} | {n} | {a} | {b} | {r.bare_name} | {bare_text} | {ratio} "
            f"| {target} | {mark} |"
        )
    return lines


def markdown(report: Report) -> str:
    meta = report.meta
    lines = [
        f"{environment(meta)} on the same machine. "
        f"Node: {meta.get('workspace', 'disk')} workspaces, warm pool {meta['warm_pool_size']}, "
        f"pre-created pool {meta.get('precreate_pool_size')}, "
        f"`AENV_PAUSE_HOT_S={PAUSE_HOT_S:g}`. {load_line(meta)}.",
        "",
        "Issue 11 (speed & density):",
        "",
        *table(headline(report), with_issue=True),
        "",
        "Every row:",
        "",
        *table(report.rows),
    ]
    if report.where:
        lines += ["", "Where the time goes (missed targets, from the node's log lines):", ""]
        lines += [f"- {w}" for w in report.where]
    if report.errors:
        lines += ["", "Errors:", *[f"- {e[:600]}" for e in report.errors]]
    return "\n".join(lines)
