"""``aenv auth login|status|logout``: the node URL and API key the other commands use.

Owns nothing on disk itself: the credentials file (``$AENV_CONFIG_DIR/auth.json``, mode 0600,
written atomically) belongs to :mod:`aenv.client.config`, whose saver and loader this calls.
``E2B_API_URL``/``E2B_API_KEY``, when set, win over the file (``aenv.client``'s rules), and
``status`` says which one is in use.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from aenv.cli.common import examples, fail, out
from aenv.client import ClientError, Credentials, load_credentials, save_credentials
from aenv.client.config import credentials_path, resolve

app = typer.Typer(help="Store, show or forget the node's URL and API key.",
                  no_args_is_help=True)


@app.command(epilog=examples("aenv auth login --url http://node:3000 --key e2b_…",
                             "E2B_API_KEY=e2b_… aenv auth login --url http://node:3000"))
def login(
    url: Annotated[str, typer.Option("--url", help="the node's (or gateway's) API URL")],
    key: Annotated[str | None, typer.Option(
        "--key", envvar="E2B_API_KEY", help="its API key (sent as X-API-KEY)")] = None,
) -> None:
    """Store URL and key (mode 0600) for every later command."""
    if not url.startswith(("http://", "https://")):
        fail(f"--url {url!r}: expected http://host:port or https://…")
    try:
        path = save_credentials(Credentials(api_url=url.rstrip("/"), api_key=key or None))
    except OSError as exc:
        fail(f"cannot write the credentials: {exc.strerror or exc}")
    out.print(f"stored {url.rstrip('/')} in {path}", soft_wrap=True)


@app.command(epilog=examples("aenv auth status"))
def status() -> None:
    """Show which node the commands talk to, and where that comes from."""
    try:
        stored = load_credentials()
        cfg = resolve()
    except ClientError as exc:
        fail(exc.message)
    path = credentials_path()
    if os.environ.get("E2B_API_URL"):
        source = "E2B_API_URL"
    elif stored is not None and stored.api_url:
        source = str(path)
    else:
        source = "default"
    key = "set" if cfg.api_key else "none"
    out.print(f"url: {cfg.api_url} (from {source})", soft_wrap=True)
    out.print(f"key: {key}", soft_wrap=True)
    out.print(f"credentials file: {path if stored is not None else f'{path} (none)'}",
              soft_wrap=True)


@app.command(epilog=examples("aenv auth logout"))
def logout() -> None:
    """Forget the stored URL and key (the environment's are not touched)."""
    path = credentials_path()
    try:
        path.unlink()
    except FileNotFoundError:
        out.print(f"no credentials stored ({path})", soft_wrap=True)
        return
    except OSError as exc:
        fail(f"cannot remove {path}: {exc.strerror or exc}")
    out.print(f"removed {path}", soft_wrap=True)
