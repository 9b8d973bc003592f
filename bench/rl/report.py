"""The benchmark's outputs: reductions against ``cold``, the markdown table, the SVG."""

from __future__ import annotations

from html import escape
from typing import Any

#: The columns compared across modes (key in a mode's result, label, lower is better).
METRICS = (
    ("env_s", "environment-seconds"),
    ("gb_h", "memory GB-hours"),
    ("wall_s", "wall time (s)"),
    ("disk_peak_added_mib", "disk peak (MiB)"),
)


def reductions(modes: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each mode's saving against ``cold``, per metric, in % (positive: less than cold)."""
    cold = modes.get("cold")
    out: dict[str, dict[str, float | None]] = {}
    for name, result in modes.items():
        if cold is None or name == "cold":
            continue
        out[name] = {}
        for key, _ in (*METRICS, ("episodes_per_h", "")):
            base, value = cold.get(key), result.get(key)
            if not base or value is None:
                out[name][key] = None
            elif key == "episodes_per_h":  # higher is better: the speed-up, as a factor
                out[name][key] = round(value / base, 2)
            else:
                out[name][key] = round(100 * (1 - value / base), 1)
    return out


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def markdown(report: dict[str, Any]) -> str:
    modes: dict[str, dict[str, Any]] = report["modes"]
    red = report["reductions"]
    lines = [
        "| mode | episodes | wall (s) | episodes/h | env-s (running) | env-s paused | "
        "memory GB-h | peak PSS (MiB) | disk peak (MiB) | env-s vs cold | GB-h vs cold | "
        "mean reward |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in modes.items():
        r = red.get(name, {})
        env_red = f"-{r['env_s']} %" if r.get("env_s") is not None else "—"
        gbh_red = f"-{r['gb_h']} %" if r.get("gb_h") is not None else "—"
        lines.append(
            f"| {name} | {m['episodes']} | {m['wall_s']:.1f} | {m['episodes_per_h']:.0f} | "
            f"{m['env_s']:.1f} | {m['paused_s']:.1f} | {m['gb_h']:.4f} | {m['peak_mib']:.0f} | "
            f"{_mib(m['disk_peak_added_mib'])} | {env_red} | {gbh_red} | {m['mean_reward']} |"
        )
    lines += [
        "",
        "| mode | sandbox role | sandboxes | running s | paused s |",
        "|---|---|---:|---:|---:|",
    ]
    for name, m in modes.items():
        for role, row in m["by_role"].items():
            lines.append(
                f"| {name} | {role} | {row['sandboxes']:.0f} | {row['running_s']:.1f} "
                f"| {row['paused_s']:.1f} |"
            )
    return "\n".join(lines)


def svg(report: dict[str, Any]) -> str:
    """One group of bars per metric, each mode's value relative to cold (cold = 100 %), the
    absolute value printed at the bar's end."""
    modes: dict[str, dict[str, Any]] = report["modes"]
    names = list(modes)
    colors = {"cold": "#d9534f", "template": "#f0ad4e", "fork": "#4c9a5a"}
    label_w, plot_w, bar_h, gap, top = 190, 460, 16, 14, 64
    group_h = bar_h * len(names) + gap
    height = top + group_h * len(METRICS) + 40
    width = label_w + plot_w + 150
    meta = report["meta"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="14" font-weight="bold">aenv bench rl: cost of '
        f"{meta['tasks']} tasks x {meta['group']} rollouts, relative to cold (= 100 %)</text>",
        f'<text x="10" y="38" fill="#555">{escape(meta["date"])}; '
        f"{escape(meta['machine']['description'])}; {meta['parallel']} agents at once</text>",
    ]
    legend_x = label_w
    for name in names:
        out.append(
            f'<rect x="{legend_x}" y="46" width="10" height="10" '
            f'fill="{colors.get(name, "#6c8ebf")}"/>'
        )
        out.append(f'<text x="{legend_x + 14}" y="55">{escape(name)}</text>')
        legend_x += 90
    for g, (key, label) in enumerate(METRICS):
        y0 = top + g * group_h
        out.append(
            f'<text x="{label_w - 8}" y="{y0 + bar_h * len(names) / 2 + 4}" '
            f'text-anchor="end">{escape(label)}</text>'
        )
        base = (
            modes.get("cold", {}).get(key)
            or max((m.get(key) or 0 for m in modes.values()), default=0)
            or 1
        )
        for i, name in enumerate(names):
            value = modes[name].get(key) or 0
            w = plot_w * min(value / base, 1.5) / 1.5
            y = y0 + i * bar_h
            out.append(
                f'<rect x="{label_w}" y="{y + 2}" width="{max(w, 1):.1f}" '
                f'height="{bar_h - 4}" fill="{colors.get(name, "#6c8ebf")}"/>'
            )
            out.append(
                f'<text x="{label_w + max(w, 1) + 4:.1f}" y="{y + bar_h - 4}" '
                f'fill="#333">{value:g} ({100 * value / base:.0f} %)</text>'
            )
    x100 = label_w + plot_w / 1.5
    out.append(
        f'<line x1="{x100:.1f}" y1="{top - 4}" x2="{x100:.1f}" '
        f'y2="{top + group_h * len(METRICS) - gap}" stroke="#999" stroke-dasharray="3,3"/>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
