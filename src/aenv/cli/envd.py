"""``aenv envd …``: build the envd bundle, or run envd in this process for development.

The bundle build itself lives in :mod:`aenv.envd.bundle`; this module only parses options,
shows progress and turns failures into a message and an exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from aenv.core.errors import AenvError
from aenv.envd import DEFAULT_PORT
from aenv.envd.bundle import BundleInfo, build_bundle

app = typer.Typer(help="envd, the daemon inside every sandbox.", no_args_is_help=True)
console = Console(stderr=True)


@app.command()
def bundle(
    out: Annotated[Path, typer.Option("--out", help="directory to build the bundle into")],
    force: Annotated[bool, typer.Option("--force", help="rebuild even when up to date")] = False,
) -> None:
    """Build the self-contained envd bundle that is mounted read-only into every sandbox."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("envd bundle: checking inputs", total=None)

        def step(name: str) -> None:
            progress.update(task, description=f"envd bundle: {name}")

        async def build() -> BundleInfo:
            return await build_bundle(out, force=force, progress=step)

        try:
            info = anyio.run(build)
        except AenvError as exc:
            progress.stop()
            console.print(f"[red]envd bundle failed:[/] {exc.message}", soft_wrap=True)
            raise typer.Exit(1) from exc
    what = "built" if info.rebuilt else "up to date"
    console.print(
        f"envd bundle {what}: {info.path} ({info.size_bytes / 1e6:.1f} MB, "
        f"Python {info.python_version}, {info.seconds:.1f} s)",
        soft_wrap=True,  # one line, whatever the terminal width: scripts grep it
    )


@app.command()
def run(
    port: Annotated[int, typer.Option(help="port to listen on")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="uvicorn/envd log level")] = "info",
) -> None:
    """Run envd in this process, unconfined (development only: it runs commands as you)."""
    # Imported here: the server pulls in uvicorn and envd's services, which the bundle
    # command does not need.
    from aenv.envd.__main__ import main as envd_main

    envd_main(["--port", str(port), "--host", host, "--log-level", log_level])
