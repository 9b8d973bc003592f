"""The plot: p50 bars, p95 whiskers, targets, bare marks."""

from __future__ import annotations

import math
from html import escape

from bench.lifecycle.common import (
    Report,
    _fmt,
)


def svg(report: Report) -> str:
    """Horizontal bars (log scale): p50 with a p95 whisker, the target as a red tick, the
    bare runsc p50 as a grey diamond. Only latency rows."""
    rows = [r for r in report.rows if r.latency is not None and r.plot]
    label_w, plot_w, row_h, top = 390, 520, 24, 56
    height = top + row_h * len(rows) + 60
    width = label_w + plot_w + 30
    values = [
        v
        for r in rows
        if r.latency is not None
        for v in (r.latency.p95_ms, r.latency.p50_ms, r.bare.p50_ms if r.bare else None, r.target)
        if v
    ]
    lo = 10 ** math.floor(math.log10(max(1.0, min(values))))
    hi = 10 ** math.ceil(math.log10(max(values)))

    def x(v: float) -> float:
        v = min(max(v, lo), hi)
        return label_w + plot_w * (math.log10(v) - math.log10(lo)) / (
            math.log10(hi) - math.log10(lo)
        )

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="14" font-weight="bold">aenv lifecycle operations: '
        "p50 (bar), p95 (whisker), target (red), bare runsc p50 (grey diamond)</text>",
        f'<text x="10" y="38" fill="#555">{escape(report.meta["date"])}; '
        f"{escape(report.meta['machine']['description'])}; ms, log scale</text>",
    ]
    decade = lo
    while decade <= hi:
        for m in (1, 2, 5):
            v = decade * m
            if v > hi:
                break
            gx = x(v)
            out.append(
                f'<line x1="{gx:.1f}" y1="{top - 4}" x2="{gx:.1f}" '
                f'y2="{top + row_h * len(rows)}" stroke="#ddd"/>'
            )
            out.append(
                f'<text x="{gx:.1f}" y="{top + row_h * len(rows) + 16}" '
                f'text-anchor="middle" fill="#555">{v:g}</text>'
            )
        decade *= 10
    for i, r in enumerate(rows):
        assert r.latency is not None
        y = top + i * row_h
        ok = r.passed
        color = {True: "#4c9a5a", False: "#d9534f", None: "#6c8ebf"}[ok]
        out.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">'
            f"{escape((r.plot_name or r.name)[:58])}</text>"
        )
        bar = x(r.latency.p50_ms) - label_w
        out.append(
            f'<rect x="{label_w}" y="{y + 5}" width="{max(bar, 1):.1f}" height="14" '
            f'fill="{color}" opacity="0.85"/>'
        )
        x50, x95 = x(r.latency.p50_ms), x(r.latency.p95_ms)
        out.append(
            f'<line x1="{x50:.1f}" y1="{y + 12}" x2="{x95:.1f}" y2="{y + 12}" '
            f'stroke="black"/><line x1="{x95:.1f}" y1="{y + 7}" x2="{x95:.1f}" '
            f'y2="{y + 17}" stroke="black"/>'
        )
        out.append(
            f'<text x="{max(x95, x50) + 6:.1f}" y="{y + 16}" fill="#333">'
            f"{_fmt(r.latency.p50_ms)}</text>"
        )
        if r.bare is not None:
            bx = x(r.bare.p50_ms)
            out.append(
                f'<path d="M{bx:.1f} {y + 6} l5 6 l-5 6 l-5 -6 z" fill="#888" stroke="#444"/>'
            )
        if r.target is not None and r.unit == "ms":
            tx = x(r.target)
            out.append(
                f'<line x1="{tx:.1f}" y1="{y + 2}" x2="{tx:.1f}" y2="{y + 22}" '
                f'stroke="red" stroke-width="2.5"/>'
            )
    legend_y = top + row_h * len(rows) + 34
    out.append(
        f'<text x="10" y="{legend_y}" fill="#555">green: p50 meets its target; red: '
        "misses it; blue: no target. Children of a fork are restored concurrently on "
        "2 shared vCPUs.</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
