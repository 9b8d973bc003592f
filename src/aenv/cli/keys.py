"""``aenv keys list|create|rename|revoke``: a team's API keys (``/api-keys``; docs/teams.md).

The keys are the caller's team's: the team whose key the CLI uses (``E2B_API_KEY`` or ``aenv
auth login``'s). ``--team TEAM_ID`` makes or revokes another team's key through the admin
routes (``/admin/teams/{id}/api-keys``), which need the node's operator key. A key's value is
printed once, by ``create``, and never again: the node keeps only its hash.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from aenv.cli.common import AsJson, client, err, examples, fail, out, run
from aenv.client import ApiKey, CreatedApiKey

app = typer.Typer(help="A team's API keys: list, create, rename, revoke (docs/teams.md).",
                  no_args_is_help=True)

KeyId = Annotated[str, typer.Argument(help="the key's id (aenv keys list)", show_default=False)]
KeyName = Annotated[str, typer.Argument(help="a name for people, e.g. ci or laptop",
                                        show_default=False)]
TeamOption = Annotated[str | None, typer.Option(
    "--team", help="another team's (its id), through the admin routes: needs the operator key",
    show_default=False)]

#: Printed with every new key's value, to stderr (stdout holds only the result, for scripts).
SHOWN_ONCE = ("This key is shown only now: store it somewhere safe. The node keeps only its "
              "hash; a lost key cannot be shown again (make a new one, revoke the old).")


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="keys")


@app.command("list", epilog=examples("aenv keys list", "aenv keys list --json"))
def list_keys(as_json: AsJson = False) -> None:
    """List the team's API keys (names and masks, never the values)."""
    async def flow() -> list[ApiKey]:
        async with client() as c:
            return await c.teams.list_keys()

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([_plain(k) for k in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("KEY ID", "NAME", "KEY", "CREATED (UTC)", "LAST USED (UTC)"):
        table.add_column(column, no_wrap=True)
    for k in found:
        table.add_row(k.key_id, k.name, k.masked, k.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      k.last_used.strftime("%Y-%m-%d %H:%M:%S") if k.last_used else "never")
    out.print(table)


@app.command(epilog=examples("aenv keys create ci",
                             "aenv keys create ci --json | jq -r .key",
                             "aenv keys create svc --team 6f1c…   # with the operator key"))
def create(name: KeyName, team: TeamOption = None, as_json: AsJson = False) -> None:
    """Create an API key; print its id and its value, shown this once only."""
    async def flow() -> CreatedApiKey:
        async with client() as c:
            return await c.teams.create_key(name, team_id=team)

    made = run(flow)
    if as_json:
        typer.echo(json.dumps(_plain(made), indent=2))
    else:
        typer.echo(f"key id   {made.key_id}\nname     {made.name}\napi key  {made.key}")
    err.print(SHOWN_ONCE, soft_wrap=True)


@app.command(epilog=examples("aenv keys rename 0b7e… ci-old"))
def rename(key_id: KeyId, name: KeyName) -> None:
    """Rename one of the team's API keys (its value is unchanged)."""
    async def flow() -> None:
        async with client() as c:
            await c.teams.rename_key(key_id, name)

    run(flow)
    typer.echo(key_id)


@app.command(epilog=examples("aenv keys revoke 0b7e…",
                             "aenv keys revoke 0b7e… --team 6f1c…   # with the operator key"))
def revoke(key_id: KeyId, team: TeamOption = None) -> None:
    """Revoke an API key: the node refuses it from its next call on. Print its id."""
    async def flow() -> bool:
        async with client() as c:
            return await c.teams.revoke_key(key_id, team_id=team)

    if not run(flow):
        fail(f"no API key {key_id}" + (f" in team {team}" if team else ""))
    typer.echo(key_id)


def _plain(key: ApiKey) -> dict[str, Any]:
    return {**asdict(key), "created_at": key.created_at.isoformat(),
            "last_used": key.last_used.isoformat() if key.last_used else None}
