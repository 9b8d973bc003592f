"""``aenv logs|metrics``: what the node tells about one sandbox.

``aenv logs`` pages through E2B's ``GET /v2/sandboxes/{id}/logs`` (docs/logs.md) with the e2b
SDK's own API client: the sandbox's lifecycle events and console lines, oldest first; ``-f``
polls for new ones (from the last one's time, dropping what it printed already) until the
sandbox is killed. ``aenv metrics`` prints ``GET /sandboxes/{id}/metrics`` through the SDK's
class method. Neither connects to (nor so resumes) the sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import datetime
from typing import Annotated, Any

import typer
from e2b import AsyncSandbox
from e2b.api import ApiClient
from e2b.api.client.api.sandboxes import get_v_2_sandboxes_sandbox_id_logs
from e2b.api.client.models import LogLevel, SandboxLogEntry, SandboxLogsV2Response
from e2b.api.client.types import UNSET
from e2b.connection_config import ConnectionConfig
from rich.table import Table

from aenv.cli.common import AsJson, config, err, examples, fail, out, reachable, run
from aenv.client.sandbox import envd_errors

#: Entries asked for per request (E2B's maximum).
LOG_PAGE = 1000
#: Seconds between two polls of ``aenv logs -f``.
FOLLOW_POLL_S = 1.0

SandboxId = Annotated[str, typer.Argument(help="the sandbox's id", show_default=False)]


def register(app: typer.Typer) -> None:
    app.command(epilog=examples("aenv logs i4c2…", "aenv logs -f i4c2…",
                                "aenv logs --level warn --search oom i4c2…",
                                "aenv logs --json i4c2…"))(logs)
    app.command(epilog=examples("aenv metrics i4c2…", "aenv metrics --json i4c2…"))(metrics)


def _api(cfg: Any) -> dict[str, Any]:
    return {"api_key": cfg.api_key, "api_url": cfg.api_url, "domain": cfg.domain}


def logs(sandbox_id: SandboxId, as_json: AsJson = False,
         follow: Annotated[bool, typer.Option("--follow", "-f",
                                              help="wait for new entries")] = False,
         level: Annotated[str | None, typer.Option(
             help="the lowest level shown: debug, info, warn or error")] = None,
         search: Annotated[str | None, typer.Option(
             help="only entries whose message holds this (case-sensitive)")] = None) -> None:
    """A sandbox's logs: its lifecycle and its console, oldest first."""
    async def flow() -> None:
        cfg = config()
        await reachable(cfg)
        wanted = LogLevel(level) if level else UNSET
        cursor: int | None = None
        seen: set[tuple[str, str]] = set()
        with ApiClient(ConnectionConfig(api_key=cfg.api_key, api_url=cfg.api_url,
                                        domain=cfg.domain)) as api:
            while True:
                answer = await get_v_2_sandboxes_sandbox_id_logs.asyncio_detailed(
                    sandbox_id, client=api, cursor=UNSET if cursor is None else cursor,
                    limit=LOG_PAGE, level=wanted, search=search or UNSET)
                if answer.status_code != 200 or not isinstance(answer.parsed,
                                                               SandboxLogsV2Response):
                    fail(_refusal(sandbox_id, answer.status_code, answer.content))
                page = answer.parsed.logs
                fresh = [e for e in page if (e.timestamp.isoformat(), e.message) not in seen]
                for entry in fresh:
                    _show(entry, as_json)
                if page:
                    last = page[-1].timestamp
                    cursor = int(last.timestamp() * 1000)
                    seen = {(e.timestamp.isoformat(), e.message) for e in page
                            if int(e.timestamp.timestamp() * 1000) == cursor}
                ended = any(e.message == "sandbox killed" for e in fresh)
                if len(page) == LOG_PAGE and fresh:
                    continue  # more to read now
                if not follow or ended:
                    return
                await asyncio.sleep(FOLLOW_POLL_S)

    run(flow)


def _show(entry: SandboxLogEntry, as_json: bool) -> None:
    fields = dict(entry.fields.additional_properties)
    if as_json:
        typer.echo(json.dumps({"timestamp": entry.timestamp.isoformat(),
                               "level": entry.level.value, "message": entry.message,
                               "fields": fields}))
        return
    style = {"error": "red", "warn": "yellow", "debug": "dim"}.get(entry.level.value, "")
    stamp = entry.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    out.print(f"{stamp} {entry.level.value.upper():5} {entry.message}", style=style,
              soft_wrap=True, markup=False, highlight=False)


def _refusal(sandbox_id: str, status: int, body: bytes) -> str:
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")[:200]
    if status == 404:
        return f"sandbox {sandbox_id} not found (or its logs are gone)"
    return f"the node answered {status}: {message}"


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
