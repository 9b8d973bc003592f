"""``aenv ls|pause|resume|timeout|kill|fork``: the lifecycle of sandboxes on a node.

Each command is one call (or a few, in parallel) of :class:`aenv.client.AsyncClient`; this
module parses options, shows progress on stderr and prints results on stdout. ``ls --json``
prints E2B's ``ListedSandbox`` objects (the node's ``GET /v2/sandboxes`` field names, in its
order, ``sandboxID`` first) so scripts written against E2B's list read it unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from aenv.cli.common import (
    CREATE_DEADLINE_S,
    AsJson,
    Metadata,
    client,
    err,
    examples,
    fail,
    out,
    pairs,
    run,
)
from aenv.client import ClientError, SandboxInfo

SandboxId = Annotated[str, typer.Argument(help="the sandbox's id", show_default=False)]


def register(app: typer.Typer) -> None:
    app.command("ls", epilog=examples(
        "aenv ls", "aenv ls --state paused -m run=r42", "aenv ls --json | jq '.[].sandboxID'",
    ))(ls)
    app.command(epilog=examples("aenv pause i4c2…", "aenv pause --files-only i4c2…"))(pause)
    app.command(epilog=examples("aenv resume i4c2…", "aenv resume --timeout 3600 i4c2…"))(resume)
    app.command(epilog=examples("aenv timeout i4c2… 3600"))(timeout)
    app.command(epilog=examples("aenv kill i4c2… j9d1…", "aenv kill --metadata run=r42",
                                "aenv kill --all"))(kill)
    app.command(epilog=examples("aenv fork i4c2… -n 16",
                                "aenv fork i4c2… -n 4 --json | jq -r '.[].sandboxID'"))(fork)


def wire(info: SandboxInfo) -> dict[str, Any]:
    """``info`` under E2B's names, in ``ListedSandbox``'s order with ``sandboxID`` first;
    fields the node did not send are left out (as the E2B SDK's ``to_dict`` does)."""
    fields: dict[str, Any] = {
        "sandboxID": info.sandbox_id, "templateID": info.template_id, "alias": info.alias,
        "clientID": info.client_id, "startedAt": info.started_at, "endAt": info.end_at,
        "cpuCount": info.cpu_count, "memoryMB": info.memory_mb,
        "diskSizeMB": info.disk_size_mb, "state": info.state,
        "envdVersion": info.envd_version, "metadata": info.metadata,
    }
    return {k: v for k, v in fields.items() if v is not None}


def ls(
    metadata: Metadata = None,
    state: Annotated[list[str] | None, typer.Option(
        "--state", help="running or paused (repeatable; default both)")] = None,
    as_json: AsJson = False,
) -> None:
    """List the node's sandboxes (running and paused), filtered by labels and state."""
    wanted = pairs(metadata, "--metadata")
    for s in state or ():
        if s not in ("running", "paused"):
            fail(f"--state {s!r}: expected running or paused")
    states: list[Literal["running", "paused"]] = [s for s in ("running", "paused")
                                                  if s in (state or ())]

    async def flow() -> list[SandboxInfo]:
        async with client() as c:
            return await c.list(metadata=wanted or None, state=states or None)

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([wire(i) for i in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("SANDBOX ID", "TEMPLATE", "STATE", "CPU", "MEMORY", "STARTED", "ENDS",
                   "METADATA"):
        table.add_column(column, no_wrap=column != "METADATA")
    for i in found:
        labels = " ".join(f"{k}={v}" for k, v in sorted(i.metadata.items()))
        table.add_row(i.sandbox_id, i.alias or i.template_id, i.state,
                      "" if i.cpu_count is None else str(i.cpu_count),
                      "" if i.memory_mb is None else f"{i.memory_mb} MiB",
                      _time(i.started_at), _time(i.end_at), labels)
    out.print(table)


def pause(
    sandbox_id: SandboxId,
    files_only: Annotated[bool, typer.Option(
        "--files-only", help="keep only the files (disk workspaces); resume boots afresh")
    ] = False,
) -> None:
    """Pause a running sandbox (memory and files kept); aenv resume brings it back."""
    async def flow() -> None:
        async with client() as c:
            with err.status(f"pausing {sandbox_id}"):
                await c.pause(sandbox_id, memory=not files_only)

    run(flow)
    err.print(f"paused {sandbox_id}")


def resume(
    sandbox_id: SandboxId,
    timeout_s: Annotated[int | None, typer.Option(
        "--timeout", min=1, help="seconds it lives from now (default: the node's)")] = None,
) -> None:
    """Resume a paused sandbox (a running one is left as it is)."""
    async def flow() -> None:
        async with client() as c:
            with err.status(f"resuming {sandbox_id}"):
                await c.resume(sandbox_id, timeout=timeout_s)

    run(flow)
    err.print(f"running {sandbox_id}")


def timeout(
    sandbox_id: SandboxId,
    seconds: Annotated[int, typer.Argument(min=1, help="seconds from now", show_default=False)],
) -> None:
    """Set how long from now the sandbox lives (longer or shorter than before)."""
    async def flow() -> None:
        async with client() as c:
            await c.set_timeout(sandbox_id, seconds)

    run(flow)
    err.print(f"{sandbox_id} ends in {seconds} s")


def kill(
    sandbox_ids: Annotated[list[str] | None, typer.Argument(
        help="sandbox ids", show_default=False)] = None,
    metadata: Metadata = None,
    kill_all: Annotated[bool, typer.Option("--all", help="every sandbox on the node")] = False,
) -> None:
    """Kill sandboxes by id, or every sandbox with the given labels (e.g. a dead run's).

    Prints the ids killed, one per line. Exit 1 if a named sandbox did not exist."""
    labels = pairs(metadata, "--metadata")
    ids = list(sandbox_ids or ())
    if sum(map(bool, (ids, labels, kill_all))) != 1:
        fail("name sandbox ids, or --metadata KEY=VALUE, or --all (exactly one of them)")

    async def flow() -> tuple[list[str], list[str]]:
        async with client() as c:
            with err.status("killing"):
                if labels:
                    return await c.kill_by_metadata(**labels), []
                targets = ids or [i.sandbox_id for i in await c.list()]
                done = await asyncio.gather(*(c.kill(i) for i in targets))
        killed = [i for i, ok in zip(targets, done, strict=True) if ok]
        return killed, [i for i, ok in zip(targets, done, strict=True) if not ok]

    killed, missing = run(flow)
    for sandbox_id in killed:
        typer.echo(sandbox_id)
    if labels and not killed:
        err.print(f"no sandbox has {' '.join(f'{k}={v}' for k, v in labels.items())}")
    if missing:
        fail(f"no such sandbox: {' '.join(missing)}")


def fork(
    sandbox_id: SandboxId,
    count: Annotated[int, typer.Option("-n", "--count", min=1, help="how many children")] = 1,
    timeout_s: Annotated[int | None, typer.Option(
        "--timeout", min=1, help="seconds the children live (default: the node's)")] = None,
    as_json: AsJson = False,
) -> None:
    """Fork a running sandbox: children with its files and processes; print their ids.

    Children the node could not start are reported on stderr (exit 1 if none started)."""
    async def flow() -> tuple[list[str], list[ClientError]]:
        async with client(deadline_s=CREATE_DEADLINE_S) as c:
            with err.status(f"forking {sandbox_id} into {count}"):
                forked = await c.fork(sandbox_id, count, timeout=timeout_s)
            return [s.sandbox_id for s in forked], list(forked.errors)

    children, errors = run(flow)
    if as_json:
        typer.echo(json.dumps([{"sandboxID": i} for i in children], indent=2))
    else:
        for child in children:
            typer.echo(child)
    for error in errors:
        err.print(f"warning: {error.message}", soft_wrap=True, style="yellow")
    if errors:
        err.print(f"{len(children)} of {count} children started", style="yellow")


def _time(value: str | None) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM:SS`` (the table's width; JSON keeps it whole)."""
    return "" if not value else value.replace("T", " ")[:19]
