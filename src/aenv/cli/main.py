"""``aenv``: the root command; mounts each sub-command group (``aenv envd …``) and the sandbox
commands (``aenv ls``, ``aenv exec`` …), each group in a module of its own (docs/cli.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import typer

from aenv.cli import audit, cluster, copy, doctor, execute, info, keys, sandboxes, shell, team
from aenv.cli.auth import app as auth_app
from aenv.cli.bench import app as bench_app
from aenv.cli.envd import app as envd_app
from aenv.cli.node import app as node_app
from aenv.cli.server import app as server_app
from aenv.cli.snapshot import app as snapshot_app
from aenv.cli.template import app as template_app
from aenv.cli.volume import app as volume_app

app = typer.Typer(
    name="aenv",
    help="Self-hosted sandboxes for AI agents, behind an E2B-compatible API. The node is "
         "E2B_API_URL / E2B_API_KEY, else what `aenv auth login` stored (docs/cli.md).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(auth_app, name="auth")
app.add_typer(bench_app, name="bench")
app.add_typer(envd_app, name="envd")
app.add_typer(node_app, name="node")
app.add_typer(server_app, name="server")
app.add_typer(snapshot_app, name="snapshot")
app.add_typer(template_app, name="template")
app.add_typer(volume_app, name="volume")
for group in (sandboxes, shell, execute, copy, info, doctor, cluster, audit, keys, team):
    group.register(app)


def main() -> None:
    """Entry point of the ``aenv`` console script.

    The command's exit status is final once it returns: the process then ends without the
    interpreter's finalization (``os._exit``), after flushing what it wrote. The e2b SDK's
    HTTP transport runs a Rust runtime whose worker threads are never told to stop; one still
    busy while the interpreter tears itself down panics with no Python frame to catch it,
    and the process dies with SIGABRT after a command that succeeded (seen in CI: ``aenv
    metrics``, ``aenv cp``, rc -6 with their whole output printed).
    """
    code: int | str | None = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
