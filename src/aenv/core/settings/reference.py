"""``docs/config.md``: one table per section, from the fields' docstrings."""

from __future__ import annotations

from collections.abc import Iterable

from aenv.core.settings.section import Section


def markdown(sections: Iterable[type[Section]]) -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `src/aenv/core/settings/` by `python -m aenv.core.settings`.",
        "Set keys in the TOML file named by `AENV_CONFIG` (default `/etc/aenv/aenv.toml`) or as",
        "environment variables `AENV_<KEY>` (upper case), which win over the file.",
    ]
    for section in sections:
        title, _, more = (section.__doc__ or section.__name__).partition("\n\n")
        heading, _, summary = title.partition(": ")
        lines += ["", f"## {heading}", "", summary.strip()[:1].upper() + summary.strip()[1:]]
        if more.strip():
            lines += ["", " ".join(more.split())]
        lines += ["", "| key | env | default | description |", "|---|---|---|---|"]
        for name, field in section.model_fields.items():
            default = field.default if field.default is not None else ""
            doc = " ".join((field.description or "").split())
            lines.append(f"| `{name}` | `AENV_{name.upper()}` | `{default}` | {doc} |")
    return "\n".join(lines) + "\n"
