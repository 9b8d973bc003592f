"""``aenv snapshot create|ls|rm``: snapshots of running sandboxes (E2B's snapshot API).

A snapshot's id works wherever a template does: ``aenv start SNAPSHOT_ID`` restores it.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from aenv.cli.common import CREATE_DEADLINE_S, AsJson, client, err, examples, fail, out, run
from aenv.client import SnapshotInfo

app = typer.Typer(help="Snapshots of sandboxes: create, list, remove.", no_args_is_help=True)


@app.command(epilog=examples("aenv snapshot create i4c2…",
                             "aenv snapshot create i4c2… --name prepared"))
def create(
    sandbox_id: Annotated[str, typer.Argument(help="a running sandbox", show_default=False)],
    name: Annotated[str | None, typer.Option("--name", help="a name for the snapshot")] = None,
) -> None:
    """Snapshot a running sandbox (it runs on); print the snapshot's id."""
    async def flow() -> SnapshotInfo:
        async with client(deadline_s=CREATE_DEADLINE_S) as c:
            with err.status(f"snapshotting {sandbox_id}"):
                return await c.snapshot(sandbox_id, name=name)

    typer.echo(run(flow).snapshot_id)


@app.command("ls", epilog=examples("aenv snapshot ls", "aenv snapshot ls --sandbox i4c2… --json"))
def list_snapshots(
    sandbox_id: Annotated[str | None, typer.Option(
        "--sandbox", help="only this sandbox's snapshots")] = None,
    as_json: AsJson = False,
) -> None:
    """List snapshots."""
    async def flow() -> list[SnapshotInfo]:
        async with client() as c:
            return await c.list_snapshots(sandbox_id=sandbox_id)

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([{"snapshotID": s.snapshot_id, "names": list(s.names)}
                               for s in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("SNAPSHOT ID", no_wrap=True)
    table.add_column("NAMES")
    for s in found:
        table.add_row(s.snapshot_id, ", ".join(s.names))
    out.print(table)


@app.command("rm", epilog=examples("aenv snapshot rm snap-id", "aenv snapshot rm a b c"))
def remove(
    snapshot_ids: Annotated[list[str], typer.Argument(help="snapshot ids", show_default=False)],
) -> None:
    """Remove snapshots; print each id removed (exit 1 if one did not exist)."""
    async def flow() -> list[tuple[str, bool]]:
        async with client() as c:
            return [(s, await c.delete_snapshot(s)) for s in snapshot_ids]

    done = run(flow)
    for snapshot_id, removed in done:
        if removed:
            typer.echo(snapshot_id)
    missing = [s for s, removed in done if not removed]
    if missing:
        fail(f"no such snapshot: {' '.join(missing)}")
