"""The density plot of ``bench.ksm_bench`` (docs/img/density.svg): per-child PSS by kind of
memory, and how many such children fit in the host's memory, for each mode it measured."""

from __future__ import annotations

from html import escape
from typing import Any

#: What the issue asks of an idle sandbox and of an idle fork child (MiB of PSS).
TARGETS = (("idle sandbox ≤ 35", 35.0), ("idle fork child ≤ 20", 20.0))
#: Stacked parts of a child's PSS, in the order drawn, with their colours.
PARTS = (
    ("child_pss_shmem_p50_mib", "guest memory (gVisor's memfd)", "#4c78a8"),
    ("child_pss_anon_p50_mib", "runsc's own anon (sentry, gofer, stubs)", "#f58518"),
    ("child_pss_file_p50_mib", "file pages", "#54a24b"),
)


def svg(result: dict[str, Any]) -> str:
    """One row per mode: the p50 child's PSS stacked by kind (bar), the mean child's PSS where
    some are busy (black tick), the targets (red lines), and the density as text."""
    modes = result["modes"]
    label_w, plot_w, row_h, top = 200, 460, 30, 74
    height = top + row_h * len(modes) + 84
    width = label_w + plot_w + 170
    peak = max(max(m["child_pss_mean_mib"], m["child_pss_p50_mib"]) for m in modes)
    hi = max(40.0, 10.0 * (int(peak / 10) + 1))

    def x(mib: float) -> float:
        return label_w + plot_w * min(mib, hi) / hi

    meta = result["meta"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="14" font-weight="bold">Idle sandboxes restored from one '
        f"image ({meta['children']}): PSS per sandbox and how many fit in "
        f"{meta['host_mib_for_density'] // 1024} GiB</text>",
        f'<text x="10" y="38" fill="#555">{escape(meta["date"])}; kernel '
        f"{escape(meta['kernel'])}; platform {escape(meta['platform'])}; bar: p50 child, "
        "tick: mean child (1 in 10 busy), red: targets</text>",
    ]
    legend_x = 10
    for _, name, colour in PARTS:
        out.append(f'<rect x="{legend_x}" y="48" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{legend_x + 14}" y="57">{escape(name)}</text>')
        legend_x += 24 + 7 * len(name)
    bottom = top + row_h * len(modes)
    for tick in range(0, int(hi) + 1, 10):
        gx = x(tick)
        out.append(f'<line x1="{gx:.1f}" y1="{top - 4}" x2="{gx:.1f}" y2="{bottom}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{gx:.1f}" y="{bottom + 16}" text-anchor="middle" '
                   f'fill="#555">{tick}</text>')
    out.append(f'<text x="{label_w + plot_w / 2:.0f}" y="{bottom + 34}" '
               'text-anchor="middle" fill="#555">MiB of PSS per sandbox (all its host '
               "processes)</text>")
    for i, m in enumerate(modes):
        y = top + i * row_h
        out.append(f'<text x="{label_w - 8}" y="{y + 19}" text-anchor="end">'
                   f"KSM {escape(m['mode'])}</text>")
        left = 0.0
        for key, name, colour in PARTS:
            part = float(m[key])
            out.append(
                f'<rect x="{x(left):.1f}" y="{y + 6}" width="{x(left + part) - x(left):.1f}" '
                f'height="{row_h - 12}" fill="{colour}"><title>{escape(name)}: {part} MiB'
                "</title></rect>"
            )
            left += part
        if m["busy_children"]:
            mx = x(m["child_pss_mean_mib"])
            out.append(f'<line x1="{mx:.1f}" y1="{y + 2}" x2="{mx:.1f}" y2="{y + row_h - 2}" '
                       'stroke="black" stroke-width="2"/>')
        pss = m["child_pss_mean_mib"] if m["busy_children"] else m["child_pss_p50_mib"]
        out.append(f'<text x="{label_w + plot_w + 8}" y="{y + 19}">{pss:.1f} MiB: '
                   f"<tspan font-weight=\"bold\">{m['fits_in_24_gib']}</tspan> fit</text>")
    for j, (name, mib) in enumerate(TARGETS):
        tx = x(mib)
        out.append(f'<line x1="{tx:.1f}" y1="{top - 8}" x2="{tx:.1f}" y2="{bottom}" '
                   'stroke="red" stroke-dasharray="4 3"/>')
        out.append(f'<text x="{tx:.1f}" y="{bottom + 50 + 14 * j}" text-anchor="middle" '
                   f'fill="red">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
