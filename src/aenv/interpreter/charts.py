"""A matplotlib Figure → the chart dict the SDK parses (`e2b_code_interpreter/charts.py`).

Runs inside Python kernels, loaded by ipython_startup.py (never imported by the server, and it
imports no aenv code: it is loaded from its file path). It reads what the figure's axes hold:
    lines (Line2D)              → "line":    elements [{label, points: [[x, y], ...]}]
    scatter (PathCollection)    → "scatter": elements [{label, points}]
    bar containers (Rectangle)  → "bar":     elements [{label, group, value}]
    pie wedges (Wedge)          → "pie":     elements [{label, angle, radius}]
    several axes                → "superchart" whose elements are the axes' charts
    anything else (images, boxes, mixed artists) → "unknown" with its title, no elements.
Box-and-whisker plots are not recognised (a default boxplot is lines only: it reads as
"line"). A blank figure gives None: the result then carries no chart, as E2B's does.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _value(v: Any) -> Any:
    """A JSON-safe scalar: numpy numbers as floats, dates as ISO strings, NaN as None."""
    if hasattr(v, "item") and not isinstance(v, str | bytes):
        v = v.item()  # numpy scalar (datetime64 turns into datetime or int)
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    return str(v)


def _label(text: str | None) -> str | None:
    return text or None


def _unit(label: str | None) -> str | None:
    match = _UNIT.search(label) if label else None
    return (match.group(1) or match.group(2)) if match else None


def _base(kind: str, ax: Any) -> dict[str, Any]:
    return {"type": kind, "title": _label(ax.get_title()), "elements": []}


def _axes_2d(kind: str, ax: Any) -> dict[str, Any]:
    chart = _base(kind, ax)
    x_label, y_label = _label(ax.get_xlabel()), _label(ax.get_ylabel())
    chart.update(x_label=x_label, y_label=y_label, x_unit=_unit(x_label), y_unit=_unit(y_label))
    return chart


def _scale(axis: Any, scale: str) -> str:
    from matplotlib.category import StrCategoryConverter
    from matplotlib.dates import DateConverter, _SwitchableDateConverter

    converter = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    if isinstance(converter, DateConverter | _SwitchableDateConverter):
        return "datetime"
    if isinstance(converter, StrCategoryConverter):
        return "categorical"
    return scale


def _ticks(axis: Any, scale: str) -> list[Any]:
    from matplotlib.dates import num2date

    ticks = list(axis.get_ticklocs())
    if scale == "datetime":
        return [num2date(t).isoformat() for t in ticks]
    return [_value(t) for t in ticks]


def _point_chart(kind: str, ax: Any) -> dict[str, Any]:
    chart = _axes_2d(kind, ax)
    for name, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
        scale = _scale(axis, scale)
        chart[f"{name}_scale"] = scale
        chart[f"{name}_ticks"] = _ticks(axis, scale)
        chart[f"{name}_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]
    return chart


def _default_label(label: str, prefix: str, auto: str) -> str:
    # Unlabelled artists are named "_child3" / "_container0" by matplotlib.
    if label.startswith(auto) and label[len(auto):].isdigit():
        return f"{prefix} {label[len(auto):]}"
    return label


def _line_chart(ax: Any) -> dict[str, Any]:
    chart = _point_chart("line", ax)
    for line in ax.get_lines():
        points = [[_value(x), _value(y)] for x, y in zip(line.get_xdata(), line.get_ydata(),
                                                         strict=False)]
        chart["elements"].append(
            {"label": _default_label(line.get_label(), "Line", "_child"), "points": points})
    return chart


def _scatter_chart(ax: Any) -> dict[str, Any]:
    chart = _point_chart("scatter", ax)
    for collection in ax.collections:
        points = [[_value(x), _value(y)] for x, y in collection.get_offsets()]
        chart["elements"].append(
            {"label": _default_label(collection.get_label(), "Series", "_child"),
             "points": points})
    return chart


def _tick_label(axis: Any, position: float) -> str:
    """The tick label at ``position`` (a category's name), else the position itself."""
    for loc, text in zip(axis.get_ticklocs(), axis.get_ticklabels(), strict=False):
        if math.isclose(loc, position, abs_tol=1e-9) and text.get_text():
            return str(text.get_text())
    return f"{position:g}"


def _bar_chart(ax: Any) -> dict[str, Any]:
    chart = _axes_2d("bar", ax)
    horizontal = False
    for container in ax.containers:
        group = _default_label(container.get_label(), "Group", "_container")
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        for rect in container:
            if horizontal:
                where = rect.get_y() + rect.get_height() / 2
                label, value = _tick_label(ax.yaxis, where), rect.get_width()
            else:
                where = rect.get_x() + rect.get_width() / 2
                label, value = _tick_label(ax.xaxis, where), rect.get_height()
            chart["elements"].append({"label": label, "group": group, "value": _value(value)})
    if horizontal:
        # The categories are on the y axis: the SDK's x is the category axis, as E2B's is.
        chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
        chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]
    return chart


def _pie_chart(ax: Any) -> dict[str, Any]:
    chart = _base("pie", ax)
    for wedge in ax.patches:
        chart["elements"].append({"label": wedge.get_label(),
                                  "angle": round(abs(wedge.theta2 - wedge.theta1), 6),
                                  "radius": _value(wedge.r)})
    return chart


def _kind(ax: Any) -> str:
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Rectangle, Wedge

    lines, patches, collections = list(ax.lines), list(ax.patches), list(ax.collections)
    if ax.images or ax.tables:
        return "unknown"
    if lines and not patches and not collections:
        return "line"
    if collections and not lines and not patches \
            and all(isinstance(c, PathCollection) for c in collections):
        return "scatter"
    if patches and not lines and not collections:
        if all(isinstance(p, Wedge) for p in patches):
            return "pie"
        in_containers = {id(p) for c in ax.containers for p in c}
        if all(isinstance(p, Rectangle) and id(p) in in_containers for p in patches):
            return "bar"
    return "unknown"


def _axes_chart(ax: Any) -> dict[str, Any]:
    kind = _kind(ax)
    if kind == "line":
        return _line_chart(ax)
    if kind == "scatter":
        return _scatter_chart(ax)
    if kind == "bar":
        return _bar_chart(ax)
    if kind == "pie":
        return _pie_chart(ax)
    return _base("unknown", ax)


def figure_to_chart(figure: Any) -> dict[str, Any] | None:
    """The chart of ``figure``, or None if it has nothing drawn on it."""
    axes = [ax for ax in figure.get_axes() if ax.has_data()]
    if not axes:
        return None
    # Tick labels (a bar's category name) exist only once the figure was laid out.
    figure.draw_without_rendering()
    if len(axes) == 1:
        return _axes_chart(axes[0])
    title = figure.get_suptitle() if hasattr(figure, "get_suptitle") else None
    return {"type": "superchart", "title": title or None,
            "elements": [_axes_chart(ax) for ax in axes]}
