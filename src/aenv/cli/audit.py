"""``aenv audit``: the node's audit log — who (which key) did what to which object, when,
from where, with what outcome (``GET /audit``, docs/audit.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from aenv.cli.common import AsJson, client, examples, out, run
from aenv.client import AuditRecord


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("aenv audit", "aenv audit --object i4c2…",
                                "aenv audit --actor key:1a2b3c4d5e6f --limit 500 --json"))(audit)


def audit(
    object_id: Annotated[str | None, typer.Option(
        "--object", help="only what was done to this sandbox, template, snapshot or volume")
    ] = None,
    actor: Annotated[str | None, typer.Option(
        help="only what this actor did (key:<id> or anonymous)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="the newest this many")] = 100,
    as_json: AsJson = False,
) -> None:
    """Who did what to which object: the node's audit log, newest first."""
    async def flow() -> list[AuditRecord]:
        async with client() as c:
            return await c.audit(limit=limit, object_id=object_id, actor=actor)

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([{**asdict(r), "at": r.at.isoformat()} for r in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("SEQ", "AT (UTC)", "ACTOR", "ACTION", "OBJECT", "FROM", "STATUS"):
        table.add_column(column, no_wrap=True)
    for r in found:
        table.add_row(str(r.seq), r.at.strftime("%Y-%m-%d %H:%M:%S"), r.actor, r.action,
                      r.object_id or "", r.client or "", str(r.status or "-"))
    out.print(table)
