"""``aenv team list|create|delete``: the node's teams (``/teams``; docs/teams.md).

Making and deleting teams needs the node's operator key (its configured ``api_key``); a team's
own key lists its own team. ``create`` prints the new team's first API key, once: give it to
the team, which then makes its own keys with ``aenv keys``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from aenv.cli.common import AsJson, client, err, examples, fail, out, run
from aenv.cli.keys import SHOWN_ONCE
from aenv.client import Team

app = typer.Typer(help="The node's teams: list, create, delete (the operator key; "
                       "docs/teams.md).", no_args_is_help=True)


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="team")


@app.command("list", epilog=examples("aenv team list", "aenv team list --json"))
def list_teams(as_json: AsJson = False) -> None:
    """List the teams (a team's own key: its team only)."""
    async def flow() -> list[Team]:
        async with client() as c:
            return await c.teams.list()

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([asdict(t) for t in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TEAM ID", "NAME", "DEFAULT", "QUOTA"):
        table.add_column(column, no_wrap=True)
    for t in found:
        quota = " ".join(f"{k}={v:g}" for k, v in t.quota.items())
        table.add_row(t.team_id, t.name, "yes" if t.is_default else "", quota or "-")
    out.print(table)


@app.command(epilog=examples("aenv team create rl-team",
                             "aenv team create rl-team --json | jq -r .apiKey"))
def create(
    name: Annotated[str, typer.Argument(help="the team's name (unique on the node)",
                                        show_default=False)],
    as_json: AsJson = False,
) -> None:
    """Create a team; print its id and its first API key, shown this once only."""
    async def flow() -> tuple[Team, str]:
        async with client() as c:
            return await c.teams.create(name)

    team, key = run(flow)
    if as_json:
        typer.echo(json.dumps({**asdict(team), "apiKey": key}, indent=2))
    else:
        typer.echo(f"team id  {team.team_id}\nname     {team.name}\napi key  {key}")
    err.print(SHOWN_ONCE, soft_wrap=True)


@app.command(epilog=examples("aenv team delete 6f1c…"))
def delete(
    team_id: Annotated[str, typer.Argument(help="the team's id (aenv team list)",
                                           show_default=False)],
) -> None:
    """Delete a team and its keys (once it owns no sandbox, snapshot, template or volume).
    Print its id."""
    async def flow() -> bool:
        async with client() as c:
            return await c.teams.delete(team_id)

    if not run(flow):
        fail(f"no team {team_id}")
    typer.echo(team_id)
