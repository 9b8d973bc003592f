"""A sandbox's logs (docs/logs.md; E2B's ``GET /sandboxes/{id}/logs`` and
``GET /v2/sandboxes/{id}/logs``): its lifecycle events and what its init (envd) wrote to its
console, kept per sandbox across pauses and resumes and for ``keep_s`` after it is gone.

Two sources:

* **Lifecycle**: every event the store records (``Store.on_event``: each state change, a
  death) becomes one entry — ``sandbox created``, ``sandbox paused``, ``sandbox resumed``,
  ``sandbox forked``, ``snapshot taken``, ``sandbox died: <reason>`` — with the event in
  ``fields``; ``sandbox killed`` comes from the kill (``ops/kill.py``) once the sandbox's
  processes are stopped and its console read a last time, which is before the kill answers
  (the record itself goes later, when everything is released). Queued in line, written by
  the next flush.
* **Console**: the runtime's console file of the sandbox (``Runtime.console_log``) — envd's
  own lines, and the start command's output, which envd copies there (``source: start``) —
  read
  from where the last read stopped (kept in the store, so a restart reads on), at most
  ``CONSOLE_READ_BYTES`` a time, lines cut at ``MAX_LINE``. Read every ``interval_s`` for
  running sandboxes, at each request for a sandbox's logs, and before a kill removes it.

Each sandbox keeps its newest ``max_entries``; a gone sandbox's logs go ``keep_s`` after its
last entry. One owner (the supervisor) runs the loop; a failed flush is logged and retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.core import telemetry
from aenv.core.states import SandboxState
from aenv.envd.process.console_tee import PREFIX as START_PREFIX
from aenv.orchestrator.spill_events import SPILL_ENDED
from aenv.store.sandbox_logs import LogRow, SandboxLogStore
from aenv.store.sqlite import Store

log = logging.getLogger("aenv.orchestrator.sandbox_logs")

#: Bytes of a console read at most per sandbox and pass: a guest that floods its console
#: costs the node a bounded read each time (the rest is read on the next passes).
CONSOLE_READ_BYTES = 256 * 1024
#: A console line longer than this is cut (``…`` marks the cut).
MAX_LINE = 8 * 1024
#: How often a sandbox's rows are cut back to ``max_entries`` (rows added since).
_TRIM_EVERY = 200

_STARTED = {SandboxState.CREATING: ("info", "sandbox created"),
            SandboxState.RESUMING: ("info", "sandbox resumed"),
            SandboxState.FORKING: ("info", "sandbox forked"),
            SandboxState.SNAPSHOTTING: ("info", "snapshot taken"),
            SandboxState.PAUSING: ("info", "sandbox running again (its pause did not happen)")}
_BUSY = {SandboxState.PAUSING: "pausing", SandboxState.RESUMING: "resuming",
         SandboxState.FORKING: "forking", SandboxState.SNAPSHOTTING: "taking a snapshot"}


def render(kind: str, detail: Any) -> tuple[str, str, dict[str, str]] | None:
    """An event of the store as (level, message, fields); None: not a log entry."""
    detail = detail if isinstance(detail, dict) else {}
    previous = str(detail.get("from", ""))
    fields = {"event": kind, **({"from": previous} if previous else {})}
    if kind == "died":
        reason = str(detail.get("message") or "its runtime exited")
        return "error", f"sandbox died: {reason}", {**fields, "reason": reason}
    if kind == "killed":
        return "info", "sandbox killed", fields
    if kind == "deleted":
        return None  # the release after a kill, which said "sandbox killed" already
    if kind == SPILL_ENDED:
        return "debug", "the paused sandbox's memory write to disk ended", fields
    if kind == "updated":
        what = str(detail.get("what", "configuration"))
        return "info", f"sandbox {what} updated", {**fields, "what": what}
    if not kind.startswith("state:"):
        return None
    state = kind.removeprefix("state:")
    if state == SandboxState.RUNNING:
        level, message = _STARTED.get(previous, ("info", "sandbox running"))  # type: ignore[call-overload]
        return level, message, fields
    if state == SandboxState.PAUSED:
        if previous == SandboxState.RESUMING:
            return "warn", "sandbox resume failed; it stays paused", fields
        return "info", "sandbox paused", fields
    if state == SandboxState.KILLING:
        reason = detail.get("reason")
        if reason:
            return "warn", f"sandbox ending: {reason}", {**fields, "reason": str(reason)}
        return "debug", "sandbox killing", fields
    if state in _BUSY:
        if state == SandboxState.PAUSING and previous == SandboxState.PAUSED:
            return "debug", "writing the paused sandbox's memory to disk", fields
        return "debug", f"sandbox {_BUSY[SandboxState(state)]}", fields
    return "debug", f"sandbox {state}", fields


def console_level(line: str) -> str:
    """A console line's level, from how envd's and the runtime's lines begin."""
    head = line[:40].upper()
    if head.startswith(("ERROR", "CRITICAL", "TRACEBACK", "PANIC", "FATAL")) or \
            " ERROR " in head:
        return "error"
    if head.startswith(("WARNING", "WARN")) or " WARNING " in head:
        return "warn"
    if head.startswith("DEBUG"):
        return "debug"
    return "info"


def console_entry(line: str) -> tuple[str, str, dict[str, str]]:
    """A console line as (level, message, fields): the start command's (copied there by
    envd, ``envd/process/console_tee.py``) under ``source: start`` with its stream, without
    the prefix; any other under ``source: console``."""
    if line.startswith(START_PREFIX):
        stream, sep, rest = line[len(START_PREFIX):].partition("] ")
        if sep and stream in ("stdout", "stderr"):
            return console_level(rest), rest, {"source": "start", "stream": stream}
    return console_level(line), line, {"source": "console"}


@dataclass
class _Console:
    offset: int
    partial: bytes = b""


class LogBook:
    """``console``: the runtime's console file of a sandbox (None: none). Wire
    ``store.on_event`` to :meth:`on_event`."""

    def __init__(self, store: Store, rows: SandboxLogStore,
                 console: Callable[[str], Path | None], *, max_entries: int = 10_000,
                 keep_s: float = 86_400.0, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.rows = rows
        self.console = console
        self.max_entries = max_entries
        self.keep_s = keep_s
        self.interval_s = interval_s
        self.clock = clock
        self._pending: list[LogRow] = []
        self._added: dict[str, int] = {}
        self._consoles: dict[str, _Console] = {}
        self._lock = asyncio.Lock()

    def on_event(self, sandbox_id: str, team_id: str | None, kind: str, detail: Any,
                 record: object = None) -> None:
        rendered = render(kind, detail)
        if rendered is not None:
            level, message, fields = rendered
            self._pending.append(LogRow(sandbox_id, self.clock(), level, message, fields,
                                        team_id))

    async def flush(self) -> None:
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                await self.rows.append(batch)
            except BaseException:
                self._pending[:0] = batch  # written by the next flush
                raise
            for row in batch:
                telemetry.LOG_ENTRIES.labels(
                    source=row.fields.get("source", "lifecycle")).inc()
                added = self._added.get(row.sandbox_id, 0) + 1
                if added >= _TRIM_EVERY:
                    await self.rows.keep_newest(row.sandbox_id, self.max_entries)
                    added = 0
                self._added[row.sandbox_id] = added

    async def collect(self, sandbox_id: str, team_id: str | None) -> None:
        """Read what the sandbox's console holds past the last read into its log."""
        path = self.console(sandbox_id)
        if path is None:
            return
        state = self._consoles.get(sandbox_id)
        if state is None:
            state = self._consoles[sandbox_id] = _Console(await self.rows.offset(sandbox_id))
        chunk, size = await asyncio.to_thread(_read, path, state.offset)
        if size < state.offset:  # a new console (a restore): from its start
            state.offset, state.partial = 0, b""
            chunk, size = await asyncio.to_thread(_read, path, 0)
        if not chunk:
            return
        state.offset += len(chunk)
        data = state.partial + chunk
        *lines, state.partial = data.split(b"\n")
        if len(state.partial) > MAX_LINE:  # a line that never ends: cut it here
            lines.append(state.partial)
            state.partial = b""
        now = self.clock()
        for raw in lines:
            text = raw.decode(errors="replace").rstrip("\r")
            if not text.strip():
                continue
            if len(text) > MAX_LINE:
                text = text[:MAX_LINE] + "…"
            level, message, fields = console_entry(text)
            self._pending.append(LogRow(sandbox_id, now, level, message, fields, team_id))
        await self.rows.set_offset(sandbox_id, state.offset - len(state.partial))

    def forget(self, sandbox_id: str) -> None:
        """The sandbox's runtime is gone (killed): its console state goes too."""
        self._consoles.pop(sandbox_id, None)

    async def run(self) -> None:
        """The loop: consoles of running sandboxes read, rows flushed, gone logs dropped."""
        last_sweep = 0.0
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                running = await self.store.list([SandboxState.RUNNING])
                for record in running:
                    await self.collect(record.sandbox_id, record.team_id)
                await self.flush()
                if self.clock() - last_sweep > 60:
                    last_sweep = self.clock()
                    live = {r.sandbox_id for r in await self.store.list(list(SandboxState))}
                    await self.rows.drop_gone(live, self.clock() - self.keep_s)
                    for gone in set(self._consoles) - live:
                        self._consoles.pop(gone, None)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sandbox logs: a pass failed; the next one retries")


def _read(path: Path, offset: int) -> tuple[bytes, int]:
    """Up to ``CONSOLE_READ_BYTES`` of ``path`` from ``offset``, and its size now."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size <= offset:
                return b"", size
            f.seek(offset)
            return f.read(CONSOLE_READ_BYTES), size
    except OSError:
        return b"", offset
