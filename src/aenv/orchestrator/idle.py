"""The idle loop: running sandboxes without traffic for their idle limit are paused.

The limit is the sandbox's ``aenv.idlePauseSeconds`` metadata (set at create by any E2B SDK;
``"0"`` turns it off for that sandbox), else the node's ``idle_pause_s`` (unset: off). Traffic
is what ``orchestrator/activity.py`` records (proxied requests, API calls naming the sandbox)
plus any proxied stream still open (``StreamRegistry``): a sandbox running a long
``commands.run`` or holding a WebSocket is never idle.

The pause is the ordinary two-tier one (``ops/pause.py``: frozen at once, written to disk
after ``pause_hot_s``). The sandbox resumes on ``connect``, or on its next proxied request when
it was created with ``autoResume``; without it, it stays paused until a ``connect`` (as a
sandbox paused at the end of its lifetime does), and a paused sandbox's lifetime does not run.

Runs as one supervised task of the server. Races are harmless: another operation holding the
sandbox makes the pause's compare-and-set fail (``Conflict``, skipped), and traffic arriving
while the pause takes the record gives it back running (``pause(..., unless=...)``).
"""

from __future__ import annotations

import asyncio
import logging

from aenv.core.errors import AenvError, Conflict, InvalidArgument
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.pause import pause
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.idle")

#: The per-sandbox setting, a metadata key so that the unmodified SDKs can set it.
METADATA_KEY = "aenv.idlePauseSeconds"


def _parse(value: str) -> int | None:
    # ASCII digits only: int() would also take " 30", "+30", "3_0" and "٣٠".
    return int(value) if value.isascii() and value.isdigit() else None


def check_metadata(metadata: dict[str, str] | None) -> None:
    """Raise ``InvalidArgument`` (400) if the create request's idle setting is not a whole
    number of seconds."""
    value = (metadata or {}).get(METADATA_KEY)
    if value is not None and _parse(value) is None:
        raise InvalidArgument(
            f"metadata {METADATA_KEY} must be a whole number of seconds (0: never), "
            f"not {value!r}")


def idle_limit(record: SandboxRecord, default: int | None) -> int | None:
    """The sandbox's idle limit in seconds; None: never idle-paused."""
    value = record.metadata.get(METADATA_KEY)
    seconds = default if value is None else _parse(value)
    if value is not None and seconds is None:
        seconds = default  # not checked at create (e.g. a cold start): the node's default
    return seconds or None


async def pause_idle_once(node: Node) -> list[str]:
    """Pause every running sandbox idle beyond its limit; returns the ids paused."""
    running = await node.store.list([SandboxState.RUNNING])
    node.activity.retain({r.sandbox_id for r in running})
    due: list[tuple[str, int]] = []
    for record in running:
        sid = record.sandbox_id
        limit = idle_limit(record, node.settings.idle_pause_s)
        if limit is None:
            continue
        idle = node.activity.idle_for(sid)
        if idle is None or node.streams.count(sid):
            # Newly running (created, resumed, recovered): its idle time starts now. An open
            # stream is traffic for as long as it lasts.
            node.activity.touch(sid)
        elif idle >= limit:
            due.append((sid, limit))
    results = await asyncio.gather(*(_pause_idle(node, sid, limit) for sid, limit in due),
                                   return_exceptions=True)
    paused = []
    for (sid, _), result in zip(due, results, strict=True):
        if result is True:
            paused.append(sid)
        elif isinstance(result, AenvError):
            log.info("idle pause of %s skipped: %s", sid, result.message)
        elif isinstance(result, BaseException):
            log.error("idle pause of %s failed", sid, exc_info=result)
    return paused


async def _pause_idle(node: Node, sandbox_id: str, limit: int) -> bool:
    def busy() -> bool:
        idle = node.activity.idle_for(sandbox_id)
        return idle is None or idle < limit or node.streams.count(sandbox_id) > 0

    try:
        await pause(node, sandbox_id, unless=busy, wait=0)
    except Conflict:
        return False  # traffic came, or another operation holds it: not idle after all
    log.info("idle-paused %s: no traffic for %d s", sandbox_id, limit)
    return True


async def run_idle_loop(node: Node) -> None:
    failures = 0
    while True:
        try:
            await pause_idle_once(node)
            failures = 0
        except Exception:
            failures += 1
            log.exception("the idle pass failed (%d in a row)", failures)
        await asyncio.sleep(min(node.settings.idle_check_interval_s * 2 ** failures, 30.0))
