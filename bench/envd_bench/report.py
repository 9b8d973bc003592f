"""The targets' verdicts and the markdown tables of docs/benchmarks.md (envd section)."""

from __future__ import annotations

from bench.envd_bench.common import (
    TARGET_IDLE_RSS_MIB,
    TARGET_ROUND_TRIP_P50_MS,
    TARGET_THROUGHPUT_MIB_S,
    Report,
)


def evaluate_targets(report: Report) -> None:
    def target(name: str, measured: float | None, limit: float, higher_is_better: bool) -> None:
        ok = measured is not None and (measured >= limit if higher_is_better else measured <= limit)
        sign = ">=" if higher_is_better else "<="
        report.targets.append(
            {"name": name, "measured": measured, "target": f"{sign} {limit:g}", "pass": ok}
        )

    if report.latency:
        target("round trip p50 (ms)", report.latency[0].p50_ms, TARGET_ROUND_TRIP_P50_MS, False)
    for t in report.throughput:
        target(
            f"{t.name} p50 (MiB/s)",
            t.p50_mib_s if not t.error else None,
            TARGET_THROUGHPUT_MIB_S,
            True,
        )
    if report.memory:
        target(
            "idle envd RSS after start (MiB)", report.memory[0].rss_mib, TARGET_IDLE_RSS_MIB, False
        )


def _mark(ok: bool) -> str:
    return "pass" if ok else "**miss**"


def markdown(report: Report) -> str:
    meta = report.meta
    targets = {t["name"]: t for t in report.targets}
    lines = [
        f"envd: **{meta['envd']['kind']}** (`{meta['envd']['path']}`, exec-as helper: "
        f"{'yes' if meta['envd'].get('exec_helper') else 'no'}); "
        f"{meta['machine']['description']}; {meta['date']}; "
        f"client: e2b {meta['sdk']} (Python {meta['python']}), same machine. "
        f"envd start to healthy: {meta['envd_start_to_healthy_ms']} ms. "
        f"Load average before/after: {meta['loadavg_before'][0]}/{meta['loadavg_after'][0]}.",
        "",
        f"| Latency ({report.latency[0].n if report.latency else 0} runs after "
        f"{meta['warmup']} warm-up) | p50 ms | p95 ms | mean ms | target | |",
        "|---|---:|---:|---:|---|---|",
    ]
    for lat in report.latency:
        row = f"| {lat.name} | {lat.p50_ms:.2f} | {lat.p95_ms:.2f} | {lat.mean_ms:.2f} |"
        if lat is report.latency[0]:
            t = targets["round trip p50 (ms)"]
            row += f" {t['target']} | {_mark(t['pass'])} |"
        else:
            row += " | |"
        lines.append(row)
    d = report.derived
    if d:
        lines += [
            f"| bare spawn `/bin/bash -l -c true` (loop in the sandbox) | "
            f"{d['bare_spawn_bash_login_ms']:.2f} | | | | |",
            f"| bare spawn `/bin/true` (loop in the sandbox) | "
            f"{d['bare_spawn_bin_true_ms']:.2f} | | | | |",
            f"| **envd overhead** = SDK round trip p50 - bare bash spawn | "
            f"**{d['envd_overhead_ms']:.2f}** | | | | |",
            f"| of which: uid switch (raw Start `/bin/true`: user p50 - root p50) | "
            f"{d['uid_switch_cost_ms']:.2f} | | | | |",
            f"| client difference: SDK p50 - raw httpx Start p50 (same request) | "
            f"{d['sdk_vs_httpx_client_ms']:.2f} | | | | |",
        ]
    if report.throughput:
        size = report.throughput[0].size_mib
        lines += [
            "",
            f"| Throughput ({size:g} MiB random, SHA-256 checked) | p50 MiB/s | min | max "
            "| target | |",
            "|---|---:|---:|---:|---|---|",
        ]
        for tp in report.throughput:
            if tp.error:
                lines.append(f"| {tp.name} | error: {tp.error[:80]} | | | | **miss** |")
                continue
            tgt = targets[f"{tp.name} p50 (MiB/s)"]
            check = "" if tp.verified else " (content MISMATCH)"
            lines.append(
                f"| {tp.name}{check} | {tp.p50_mib_s:.0f} | {tp.min_mib_s:.0f} "
                f"| {tp.max_mib_s:.0f} | {tgt['target']} | {_mark(tgt['pass'])} |"
            )
    if report.memory:
        lines += [
            "",
            "| envd memory | RSS MiB | PSS MiB | PSS anon MiB | peak RSS MiB | target | |",
            "|---|---:|---:|---:|---:|---|---|",
        ]
        for m in report.memory:
            row = f"| {m.when} | {m.rss_mib} | {m.pss_mib} | {m.pss_anon_mib} | {m.peak_rss_mib} |"
            if m is report.memory[0]:
                t = targets["idle envd RSS after start (MiB)"]
                row += f" RSS {t['target']} | {_mark(t['pass'])} |"
            else:
                row += " | |"
            lines.append(row)
    if report.errors:
        lines += ["", "Errors:", *[f"- {e}" for e in report.errors]]
    return "\n".join(lines)
