"""``aenv logs|metrics``: what the node tells about one sandbox.

The node has no logs route (E2B's ``GET /sandboxes/{id}/logs`` is not served: a sandbox's
console log stays on the node, under ``<home>/runtime/<id>/logs``). ``aenv logs`` says so and
prints what the node does keep: the sandbox's state, times, lifecycle and network settings
(``GET /sandboxes/{id}``). ``aenv metrics`` prints ``GET /sandboxes/{id}/metrics``. Both go
through the e2b SDK's class methods, which do not connect to (and so do not resume) the sandbox.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Annotated, Any

import typer
from e2b import AsyncSandbox
from rich.table import Table

from aenv.cli.common import AsJson, config, err, examples, out, reachable, run
from aenv.client.sandbox import envd_errors

SandboxId = Annotated[str, typer.Argument(help="the sandbox's id", show_default=False)]


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("aenv logs i4c2…", "aenv logs --json i4c2…"))(logs)
    app.command(epilog=examples("aenv metrics i4c2…", "aenv metrics --json i4c2…"))(metrics)


def _api(cfg: Any) -> dict[str, Any]:
    return {"api_key": cfg.api_key, "api_url": cfg.api_url, "domain": cfg.domain}


def logs(sandbox_id: SandboxId, as_json: AsJson = False) -> None:
    """What the node records of a sandbox: state, times, lifecycle (it serves no log lines)."""
    async def flow() -> dict[str, Any]:
        cfg = config()
        await reachable(cfg)
        with envd_errors(sandbox_id, f"get {sandbox_id}"):
            info = await AsyncSandbox.get_info(sandbox_id, **_api(cfg))
        return {k: _plain(v) for k, v in dataclasses.asdict(info).items()}

    info = run(flow)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    err.print("note: this node serves no sandbox log lines; its record of the sandbox:",
              style="dim")
    for key, value in info.items():
        if value not in (None, {}, []):
            shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
            out.print(f"{key}: {shown}", soft_wrap=True)


def metrics(sandbox_id: SandboxId, as_json: AsJson = False) -> None:
    """CPU, memory and disk of a running sandbox (the node's latest sample)."""
    async def flow() -> list[dict[str, Any]]:
        cfg = config()
        await reachable(cfg)
        with envd_errors(sandbox_id, f"metrics of {sandbox_id}"):
            found = await AsyncSandbox.get_metrics(sandbox_id, **_api(cfg))
        return [{k: _plain(v) for k, v in dataclasses.asdict(m).items()} for m in found]

    samples = run(flow)
    if as_json:
        typer.echo(json.dumps(samples, indent=2))
        return
    if not samples:
        err.print(f"no metrics for {sandbox_id} (is it paused?)")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("TIME", "CPU", "CPU USED", "MEMORY", "DISK"):
        table.add_column(column, no_wrap=True)
    for m in samples:
        table.add_row(str(m["timestamp"])[:19], str(m["cpu_count"]),
                      f"{m['cpu_used_pct']:.1f} %",
                      f"{_mib(m['mem_used'])} / {_mib(m['mem_total'])} MiB",
                      f"{_mib(m['disk_used'])} / {_mib(m['disk_total'])} MiB")
    out.print(table)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f}"


def _plain(value: Any) -> Any:
    """JSON-friendly: datetimes as ISO text, enums as their value."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, str | int | float | bool):
        return value.value
    return value
