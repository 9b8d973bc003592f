"""``aenv server``: run the node server (E2B control plane + proxy + gVisor sandboxes)."""

from __future__ import annotations

from typing import Annotated

import typer

from aenv.cli.envd import console

app = typer.Typer(help="The node server.")


@app.callback(invoke_without_command=True)
def server(
    listen: Annotated[str | None, typer.Option(help="host:port (default AENV_LISTEN)")] = None,
    home: Annotated[str | None, typer.Option(help="state directory (default AENV_HOME)")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="join the cluster at this Redis URL (default AENV_CLUSTER)")] = None,
    advertise: Annotated[str | None, typer.Option(
        help="URL other cluster members reach this node at (default AENV_ADVERTISE, "
             "else http://LISTEN)")] = None,
) -> None:
    """Serve on AENV_LISTEN (default 127.0.0.1:3000). Configuration: AENV_* variables or the
    TOML file named by AENV_CONFIG; see docs/config.md."""
    from aenv import server as node_server
    from aenv.core.errors import AenvError
    from aenv.core.settings import Settings

    overrides = {k: v for k, v in (("listen", listen), ("home", home), ("cluster", cluster),
                                   ("advertise", advertise)) if v is not None}
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/] {exc}")
        raise typer.Exit(2) from None
    try:
        node_server.main(settings)
    except AenvError as exc:
        console.print(f"[red]aenv server failed:[/] {exc.message}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
