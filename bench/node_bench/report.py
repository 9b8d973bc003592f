"""The targets' verdicts and the markdown tables of docs/benchmarks.md (node server section)."""

from __future__ import annotations

from bench.envd_bench.common import Latency
from bench.header import environment, load_line
from bench.node_bench.common import (
    TARGET_CREATE_RATIO,
    TARGET_IDLE_PSS_MIB,
    TARGET_ROUND_TRIP_P50_MS,
    Report,
)


def evaluate_targets(report: Report) -> None:
    def target(name: str, measured: float | None, limit: float, note: str = "") -> None:
        ok = measured is not None and measured <= limit
        report.targets.append(
            {
                "name": name,
                "measured": measured,
                "target": f"<= {limit:g}",
                "pass": ok,
                "note": note,
            }
        )

    bare = report.bare[2].p50_ms if report.bare else None
    for name, rows in report.create.items():
        total = rows[2].p50_ms
        ratio = round(total / bare, 2) if bare else None
        target(
            f"{name}: create → first command p50 / bare runsc p50 (ratio)",
            ratio,
            TARGET_CREATE_RATIO,
            f"{total:.0f} ms / {bare:.0f} ms" if bare else "",
        )
    if report.round_trip:
        target(
            'commands.run("true") p50 through the proxy (ms)',
            report.round_trip[0].p50_ms,
            TARGET_ROUND_TRIP_P50_MS,
        )
    if report.memory_summary:
        target(
            "idle sandbox PSS, mean (MiB)",
            report.memory_summary["pss_mean_mib"],
            TARGET_IDLE_PSS_MIB,
        )


def _mark(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def _lat_rows(rows: list[Latency]) -> list[str]:
    return [
        f"| {r.name} | {r.n} | {r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.mean_ms:.1f} | {r.min_ms:.1f} |"
        for r in rows
    ]


def _phase_text(phases: dict[str, float]) -> str:
    cpu = {k: v for k, v in phases.items() if k.endswith("_cpu_ms")}
    steps = {k: v for k, v in phases.items() if k not in cpu and k != "server_total"}
    parts = []
    if steps:
        total = phases.get("server_total", sum(steps.values()))
        parts.append(f"total {total:.0f} = " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()))
    names = {"sandbox_cpu_ms": "sandbox CPU", "server_cpu_ms": "server CPU"}
    if cpu:
        parts.append(", ".join(f"{names.get(k, k)} {v:.0f}" for k, v in cpu.items()))
    return "; ".join(parts) or "(not logged)"


def _opt(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def markdown(report: Report) -> str:
    """The report as the tables of docs/benchmarks.md (node server section)."""
    meta = report.meta
    lines = [f"{environment(meta)}, same machine. {load_line(meta)}."]
    header = "| {} | n | p50 ms | p95 ms | mean ms | min ms |\n|---|---:|---:|---:|---:|---:|"
    if report.create:
        runs = len(report.bare_samples)
        lines += ["", header.format(f"Create ({runs} interleaved rounds, after 1 warm-up)")]
        for rows in report.create.values():
            lines += _lat_rows(rows)
        lines += _lat_rows(report.bare)
    if report.phases:
        lines += ["", "| Phases and CPU (p50 ms) | |", "|---|---|"]
        for name, phases in report.phases.items():
            where = " (server log)" if name != "bare" else ""
            lines.append(f"| {name}{where} | {_phase_text(phases)} |")
    if report.round_trip:
        n = report.round_trip[0].n
        d = report.derived
        derived = [
            (
                "bare spawn `/bin/bash -l -c true` (loop inside the sandbox)",
                d["bare_spawn_bash_login_ms"],
            ),
            ("bare spawn `/bin/true` (loop inside the sandbox)", d["bare_spawn_bin_true_ms"]),
            ("SDK round trip p50 - bare `bash -l` spawn", d["overhead_over_bare_bash_ms"]),
            ("proxy cost on `Start` bash (proxy - direct)", d["proxy_start_minus_direct_ms"]),
            ("proxy cost on `/health` (proxy - direct)", d["proxy_health_minus_direct_ms"]),
            (
                "SDK - raw httpx `Start` (same request, both through the proxy)",
                d["sdk_minus_httpx_ms"],
            ),
        ]
        lines += ["", header.format(f"Round trip ({n} interleaved runs)")]
        lines += _lat_rows(report.round_trip)
        lines += [f"| {name} | | {value:.1f} | | | |" for name, value in derived]
    c = report.concurrent
    if c:
        phases = c.get("server_phases_p50_ms", {})
        lines += [
            "",
            f"| {c['count']} concurrent creates (cold node; load {c['loadavg_before']} before) "
            "| p50 ms | p95 ms | max / wall ms |",
            "|---|---:|---:|---:|",
            f"| wall time until {c['succeeded']} of {c['count']} answered a command | | "
            f"| {c['wall_ms']:.0f} |",
            f"| per create: `Sandbox.create()` | {c['create']['p50_ms']:.0f} "
            f"| {c['create']['p95_ms']:.0f} | |",
            f"| per create: create → first command | {c['create_to_first_command']['p50_ms']:.0f} "
            f"| {c['create_to_first_command']['p95_ms']:.0f} | |",
            *[
                f"| server phase {k} | {v:.0f} | | {c['server_phases_max_ms'][k]:.0f} |"
                for k, v in phases.items()
                if k != "server_total"
            ],
            f"| CPU per create (sandbox cgroups + server, mean) | {c['cpu_per_create_ms']:.0f} "
            "| | |"
            if c.get("cpu_per_create_ms") is not None
            else "| CPU per create | n/a | | |",
        ]
    if report.memory:
        s = report.memory_summary
        lines += [
            "",
            f"| Idle sandbox memory ({s['sandboxes']} sandboxes, idle {s['idle_s']:g} s; MiB) "
            "| PSS | anon | file | shmem | sentry | gofer | stubs | memcg usage "
            "| envd RSS (guest) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for m in report.memory:
            k = m.by_kind_mib
            lines.append(
                f"| `{m.sandbox_id}` ({m.processes} processes) | {m.pss_mib:.1f} "
                f"| {m.pss_anon_mib:.1f} | {m.pss_file_mib:.1f} | {m.pss_shmem_mib:.1f} "
                f"| {k.get('runsc-sandbox', 0):.1f} | {k.get('runsc-gofer', 0):.1f} "
                f"| {k.get('systrap stubs', 0):.1f} | {_opt(m.cgroup_usage_mib)} "
                f"| {_opt(m.envd_guest_rss_mib)} |"
            )
        lines += [
            f"| **mean per sandbox** | **{s['pss_mean_mib']:.1f}** | | | | | | "
            f"| {s['cgroup_usage_mean_mib']:.1f} | |",
            f"| mean per sandbox without file pages (anon + shmem) "
            f"| {s['pss_anon_shmem_mean_mib']:.1f} | | | | | | | | |",
            f"| total of the {s['sandboxes']} sandboxes (server not included) "
            f"| {s['pss_total_mib']:.1f} | | | | | | | | |",
            f"| the node server process itself | {s['server_pss_mib']:.1f} | | | | | | | | |",
        ]
    lines += ["", "| Target | Measured | Target | |", "|---|---|---|---|"]
    for t in report.targets:
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(
            f"| {t['name']} | {t['measured']}{note} | {t['target']} | {_mark(t['pass'])} |"
        )
    if report.errors:
        lines += ["", "Errors:", *[f"- {e[:500]}" for e in report.errors]]
    return "\n".join(lines)
