"""``aenv volume create|ls|rm|files|get|put|mkdir|rmf``: persistent volumes and their files,
without a sandbox (E2B's volume API, through :class:`aenv.client.Volumes`).

A volume is named by its id or its name wherever one is asked for (a name is looked up in the
list). Files travel streamed both ways, never whole in memory. Paths in a volume are
volume-absolute (``/data/x``; a relative one is taken from ``/``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from aenv.cli.common import AsJson, client, err, examples, fail, out, run
from aenv.client import ClientError, Conflict, VolumeEntry, VolumeInfo, Volumes

app = typer.Typer(help="Persistent volumes and their files: create, list, copy, remove.",
                  no_args_is_help=True)

T = TypeVar("T")

VolumeArg = Annotated[str, typer.Argument(help="the volume's id or name", show_default=False)]
RemotePath = Annotated[str, typer.Argument(help="a path in the volume", show_default=False)]


def _with_volume(ref: str, step: Callable[[Volumes, VolumeInfo], Awaitable[T]]) -> T:
    """Run ``step`` on the volume ``ref`` names; a local file's failure is one line too."""
    async def flow() -> T:
        async with client() as c:
            volumes = c.volumes
            # With its token now: steps of several calls then need no more GETs.
            found = await volumes.get((await volumes.find(ref)).volume_id)
            return await step(volumes, found)

    try:
        return run(flow)
    except OSError as exc:  # run() converts the node's errors, not this machine's
        fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


@app.command(epilog=examples("aenv volume create data",
                             "aenv volume create scratch --size-mb 4096"))
def create(
    name: Annotated[str, typer.Argument(
        help="letters, digits, '-' and '_'", show_default=False)],
    size_mb: Annotated[int | None, typer.Option(
        "--size-mb", help="its size, the most it holds (default: the node's)")] = None,
) -> None:
    """Create an empty volume; print its id."""
    async def flow() -> VolumeInfo:
        async with client() as c:
            return await c.volumes.create(name, size_mb=size_mb)

    typer.echo(run(flow).volume_id)


@app.command("ls", epilog=examples("aenv volume ls", "aenv volume ls --json"))
def list_volumes(as_json: AsJson = False) -> None:
    """List the volumes."""
    async def flow() -> list[VolumeInfo]:
        async with client() as c:
            return await c.volumes.list()

    found = run(flow)
    if as_json:
        typer.echo(json.dumps([v.wire() for v in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("VOLUME ID", "NAME", "SIZE"):
        table.add_column(column, no_wrap=True)
    for v in found:
        table.add_row(v.volume_id, v.name, "" if v.size_mb is None else f"{v.size_mb} MiB")
    out.print(table)


@app.command("rm", epilog=examples("aenv volume rm data", "aenv volume rm 6f1c… scratch"))
def remove(
    volumes: Annotated[list[str], typer.Argument(
        help="volume ids or names", show_default=False)],
) -> None:
    """Delete volumes and their files; print each id deleted (exit 1 if one was not)."""
    async def flow() -> tuple[list[str], list[str]]:
        removed: list[str] = []
        failed: list[str] = []
        async with client() as c:
            v = c.volumes
            for ref in volumes:
                try:
                    info = await v.find(ref)
                    if await v.delete(info.volume_id):
                        removed.append(info.volume_id)
                    else:
                        failed.append(f"no volume with the id or name {ref!r}")
                except ClientError as exc:  # one volume in use does not stop the others
                    failed.append(" ".join(exc.message.split()))
        return removed, failed

    removed, failed = run(flow)
    for volume_id in removed:
        typer.echo(volume_id)
    if failed:
        fail("; ".join(failed))


@app.command(epilog=examples("aenv volume files data", "aenv volume files data /logs -d 3",
                             "aenv volume files data --json | jq -r '.[].path'"))
def files(
    volume: VolumeArg,
    path: Annotated[str, typer.Argument(help="a directory in the volume")] = "/",
    depth: Annotated[int | None, typer.Option(
        "--depth", "-d", min=1, help="levels below PATH (default 1)")] = None,
    as_json: AsJson = False,
) -> None:
    """List the files under a directory of a volume."""
    found = _with_volume(volume, lambda v, info: v.list_dir(info, path, depth=depth))
    if as_json:
        typer.echo(json.dumps([e.wire() for e in found], indent=2))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TYPE", "SIZE", "MODE", "OWNER", "MODIFIED", "PATH"):
        table.add_column(column, no_wrap=True, justify="right" if column == "SIZE" else "left")
    for e in found:
        table.add_row(e.type, str(e.size), f"{e.mode:04o}", f"{e.uid}:{e.gid}",
                      e.mtime.isoformat(sep=" ", timespec="seconds")[:19], _shown(e))
    out.print(table)


@app.command(epilog=examples("aenv volume get data /results/run.json ./run.json",
                             "aenv volume get data /results/run.json ./out/",
                             "aenv volume get data /logs/app.log | tail"))
def get(
    volume: VolumeArg,
    remote_path: RemotePath,
    local_path: Annotated[str, typer.Argument(
        help="a file, a directory to put it in, or - (stdout)")] = "-",
) -> None:
    """Copy a file out of a volume (to stdout by default)."""
    if local_path == "-":
        async def to_stdout(v: Volumes, info: VolumeInfo) -> None:
            try:
                async for piece in v.iter_file(info, remote_path):
                    sys.stdout.buffer.write(piece)
                sys.stdout.buffer.flush()
            except BrokenPipeError:  # `| head` read what it wanted: not an error
                raise typer.Exit(0) from None

        _with_volume(volume, to_stdout)
        return
    target = Path(local_path)
    if target.is_dir():
        name = PurePosixPath(remote_path).name
        if not name:
            fail(f"{remote_path}: not a file name")
        target = target / name

    async def to_file(v: Volumes, info: VolumeInfo) -> int:
        with err.status(f"{info.name}:{remote_path} → {target}"):
            return await v.download(info, remote_path, target)

    size = _with_volume(volume, to_file)
    err.print(f"{target}: {size} bytes")


@app.command(epilog=examples("aenv volume put data ./model.bin /models/model.bin --force",
                             "aenv volume put data ./notes.txt /notes.txt"))
def put(
    volume: VolumeArg,
    local_path: Annotated[Path, typer.Argument(help="a local file", show_default=False)],
    remote_path: RemotePath,
    force: Annotated[bool, typer.Option(
        "--force", "-f", help="replace an existing file and make missing parents")] = False,
) -> None:
    """Copy a local file into a volume (streamed)."""
    if not local_path.is_file():
        fail(f"{local_path}: not a file")

    async def step(v: Volumes, info: VolumeInfo) -> VolumeEntry:
        with err.status(f"{local_path} → {info.name}:{remote_path}"):
            try:
                return await v.upload(info, remote_path, local_path, force=force)
            except Conflict as exc:
                if not force and "already exists" in exc.message:
                    exc.message += " (--force replaces it)"
                raise

    entry = _with_volume(volume, step)
    err.print(f"{volume}:{entry.path}: {entry.size} bytes")


@app.command(epilog=examples("aenv volume mkdir data /results",
                             "aenv volume mkdir data -p /results/2024/run-1"))
def mkdir(
    volume: VolumeArg,
    paths: Annotated[list[str], typer.Argument(help="directories to make", show_default=False)],
    parents: Annotated[bool, typer.Option(
        "--parents", "-p", help="make missing parents; an existing directory is fine")] = False,
) -> None:
    """Make directories in a volume."""
    async def step(v: Volumes, info: VolumeInfo) -> None:
        for path in paths:
            await v.make_dir(info, path, force=parents)

    _with_volume(volume, step)


@app.command(epilog=examples("aenv volume rmf data /old.log", "aenv volume rmf data /tmp /cache"))
def rmf(
    volume: VolumeArg,
    paths: Annotated[list[str], typer.Argument(
        help="files or directories (with everything in them)", show_default=False)],
) -> None:
    """Remove files or directories (recursively) from a volume."""
    async def step(v: Volumes, info: VolumeInfo) -> None:
        for path in paths:
            await v.remove(info, path)

    _with_volume(volume, step)


def _shown(entry: VolumeEntry) -> str:
    return entry.path if entry.target is None else f"{entry.path} -> {entry.target}"
