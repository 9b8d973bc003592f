"""E2B's sandbox logs (``orchestrator/sandbox_logs.py`` keeps them; docs/logs.md).

``GET /v2/sandboxes/{id}/logs?cursor=<ms>&limit=<≤1000>&direction=forward|backward
&level=debug|info|warn|error&search=<substring>`` → ``{"logs": [SandboxLogEntry]}``: entries
from ``cursor`` on (forward, the default) or up to it, newest first (backward); at ``level``
or above; whose message holds ``search`` (case-sensitive, ≤ 256 characters). The next page
starts at the last entry's time (an entry at that very millisecond comes again: a client
drops what it has seen, as ``aenv logs -f`` does).

``GET /sandboxes/{id}/logs?start=<ms>&limit=`` (E2B's deprecated v1) → ``{"logs":
[{"timestamp", "line"}], "logEntries": [SandboxLogEntry]}``, forward from ``start``.

A sandbox's logs outlive it (``sandbox_log_keep_s``): a killed sandbox's are read by its
team as a running one's. Reading logs is not traffic to the sandbox (it does not keep it from
its idle pause).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from aenv.api.auth import CallerDep
from aenv.api.convert import iso
from aenv.api.node import NodeDep
from aenv.api.ownership import guard_path
from aenv.core.errors import NotFound
from aenv.core.ids import is_sandbox_id
from aenv.orchestrator.context import Node
from aenv.orchestrator.tenancy import Caller
from aenv.store.sandbox_logs import LogRow

router = APIRouter(dependencies=[Depends(guard_path)])


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warn = "warn"
    error = "error"


class LogsDirection(StrEnum):
    forward = "forward"
    backward = "backward"


class SandboxLogEntry(BaseModel):
    timestamp: str
    level: LogLevel
    message: str
    fields: dict[str, str]


class SandboxLog(BaseModel):
    timestamp: str
    line: str


class SandboxLogsV2(BaseModel):
    logs: list[SandboxLogEntry]


class SandboxLogs(BaseModel):
    logs: list[SandboxLog]
    logEntries: list[SandboxLogEntry]


def _entry(row: LogRow) -> SandboxLogEntry:
    return SandboxLogEntry(timestamp=iso(row.at, "milliseconds"), level=LogLevel(row.level),
                           message=row.message, fields=row.fields)


async def _rows(node: Node, caller: Caller, sandbox_id: str, *, since_ms: int | None,
                limit: int, forward: bool, level: str | None,
                search: str | None) -> list[LogRow]:
    if not is_sandbox_id(sandbox_id):
        raise NotFound(f"sandbox {sandbox_id} not found")
    record = await node.store.get(sandbox_id)
    if record is None:
        # Gone (or never here): its logs say whose it was (``guard_path`` checked a live one).
        found, team = await node.logbook.rows.team_of(sandbox_id)
        if not found or not node.tenancy.is_team(caller, team):
            raise NotFound(f"sandbox {sandbox_id} not found")
    else:
        await node.logbook.collect(sandbox_id, record.team_id)
    await node.logbook.flush()
    return await node.logbook.rows.page(
        sandbox_id, since=since_ms / 1000 if since_ms is not None else None, limit=limit,
        forward=forward, level=level, search=search)


@router.get("/v2/sandboxes/{sandbox_id}/logs", response_model=SandboxLogsV2)
async def sandbox_logs_v2(
    sandbox_id: str, node: NodeDep, caller: CallerDep,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=1000)] = 1000,
    direction: LogsDirection = LogsDirection.forward,
    level: LogLevel | None = None,
    search: Annotated[str | None, Query(max_length=256)] = None,
) -> SandboxLogsV2:
    rows = await _rows(node, caller, sandbox_id, since_ms=cursor, limit=limit,
                       forward=direction is LogsDirection.forward,
                       level=level.value if level else None, search=search)
    return SandboxLogsV2(logs=[_entry(r) for r in rows])


@router.get("/sandboxes/{sandbox_id}/logs", response_model=SandboxLogs)
async def sandbox_logs_v1(
    sandbox_id: str, node: NodeDep, caller: CallerDep,
    start: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 1000,
) -> SandboxLogs:
    rows = await _rows(node, caller, sandbox_id, since_ms=start, limit=limit, forward=True,
                       level=None, search=None)
    return SandboxLogs(logs=[SandboxLog(timestamp=iso(r.at, "milliseconds"), line=r.message)
                             for r in rows],
                       logEntries=[_entry(r) for r in rows])
