"""Kill a sandbox, whatever it is doing: kill always wins.

Prerequisites: none (any state; an operation may hold the sandbox).
On success: the record says ``killing`` at once (the sandbox is gone for every client from
then on: 404), open streams through the proxy are aborted, the operation in flight — pause,
spill, resume, snapshot, fork, move — is cancelled and unwinds, then the runtime, writable
layer, network slot and memory image are released and the record deleted. The call answers
once the sandbox's processes are killed (nothing of it runs or writes from then on; ~10 ms
when no operation was in flight), while the rest of the teardown goes on as the sandbox's
owned task, or after ``kill_answer_s`` at the latest; a sandbox with volumes answers once
they are released (the caller may use them at once). E2B's kill answers before the release
too, and a trainer that meters its sandboxes until the kill answers would otherwise pay for
~0.2 s of clean-up per sandbox (the runtime's state, the rootfs, the network slot). A second
kill waits for the whole teardown, then answers 404; so does a kill of a record left
``killing`` with no kill running (a teardown that failed half-way, or one a restart cut
short): it drives that teardown, and returns False, as the sandbox was gone for clients
already.
On failure: ``NotFound`` (never existed, or already gone). A teardown that fails half-way
leaves a ``killing`` record (invisible) that the TTL loop tries again; the call still
answers 204, as the sandbox is gone for its user. A crash mid-kill leaves a ``killing``
record that recovery finishes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aenv.core.errors import AenvError, Conflict, NotFound
from aenv.core.faults import fault
from aenv.core.states import SandboxState
from aenv.orchestrator import disk_mode, paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.teardown import teardown
from aenv.orchestrator.team_quota import team_changed
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.kill")

#: Attempts at writing ``killing`` over a record a preempted operation is still writing.
_MARK_ATTEMPTS = 20


async def kill(node: Node, sandbox_id: str, *, reason: str | None = None) -> bool:
    """``reason``: kept in ``last_error`` (a death, an expiry). True if this call killed a
    sandbox clients could see; False if it finished a kill begun before."""
    joined = node.owners.kill_in_flight(sandbox_id)
    if joined is not None:
        # Killed already, as far as clients go: this call waits as the first did, and then
        # finds it gone, as it would a moment later.
        await _answer(node, joined)
        raise NotFound(f"sandbox {sandbox_id} not found")
    record = await node.store.get(sandbox_id)
    if record is None:
        # Paused into the repository by another node: killing it is deleting that state.
        if await node.repository.lookup(paused_repo.paused_id(sandbox_id)) is None:
            raise NotFound(f"sandbox {sandbox_id} not found")
        await paused_repo.unpublish(node, sandbox_id)
        return True
    visible = record.state != SandboxState.KILLING
    node.owners.begin_kill(sandbox_id)
    await mark_killing(node, sandbox_id, reason)
    fault("kill.marked")
    node.streams.abort(sandbox_id)
    await team_changed(node, record.team_id)  # its quota is free from now, cluster-wide
    node.spiller.cancel(sandbox_id)
    stopped = asyncio.Event()
    task = node.owners.start_kill(sandbox_id, lambda: _finish(node, sandbox_id, stopped),
                                  deadline=node.settings.kill_deadline_s)
    await _answer(node, task, stopped)
    return visible


async def mark_killing(node: Node, sandbox_id: str, reason: str | None = None
                       ) -> SandboxRecord | None:
    """Write ``killing`` over whatever state the record is in (every state may go there);
    None if the record is gone."""
    for _ in range(_MARK_ATTEMPTS):
        record = await node.store.get(sandbox_id)
        if record is None:
            return None
        if record.state == SandboxState.KILLING and (reason is None or record.last_error):
            return record
        changes: dict[str, object] = {"state": SandboxState.KILLING}
        if reason is not None:
            changes["last_error"] = reason
        try:
            return await node.store.update(record, **changes)
        except Conflict:
            await asyncio.sleep(0)  # the preempted operation wrote meanwhile: read again
    raise Conflict(f"sandbox {sandbox_id} keeps changing; its kill is retried")


async def _answer(node: Node, task: asyncio.Task[None],
                  stopped: asyncio.Event | None = None) -> None:
    """Wait for the kill ``task`` to end or, given ``stopped``, for the sandbox to be
    stopped, at most ``kill_answer_s``; how the task ends is logged either way."""
    waits: set[asyncio.Future[Any]] = {task}
    if stopped is not None:
        waits.add(asyncio.ensure_future(stopped.wait()))
    try:
        await asyncio.wait(waits, timeout=node.settings.kill_answer_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits - {task}:
            waiter.cancel()
    if task.done():
        _report(task)
        return
    task.add_done_callback(_report)
    if stopped is None or not stopped.is_set():
        log.warning("the kill of %s goes on in the background", task.get_name())


def _report(task: asyncio.Task[None]) -> None:
    exc = task.exception() if not task.cancelled() else None
    if isinstance(exc, AenvError):
        # Gone for its user; the TTL loop finishes what the teardown could not.
        log.warning("%s: %s; the TTL loop tries again", task.get_name(), exc.message)
    elif exc is not None:
        log.error("%s failed", task.get_name(), exc_info=exc)


async def _finish(node: Node, sandbox_id: str, stopped: asyncio.Event) -> None:
    # The latest record: a preempted operation may have changed what the sandbox holds.
    record = await node.store.get(sandbox_id)
    if record is None:
        stopped.set()
        return
    if record.state != SandboxState.KILLING:
        record = await mark_killing(node, sandbox_id)
        if record is None:
            stopped.set()
            return
    # Its console's last lines, before the teardown removes the file.
    try:
        if node.settings.observe:
            await node.logbook.collect(sandbox_id, record.team_id)
    except Exception:
        log.warning("could not read the last console lines of %s", sandbox_id, exc_info=True)
    volumes = bool(record.volume_mounts)

    def now_stopped() -> None:
        # Here, not at the record's deletion: the kill answers now, and its log is to say
        # so (after the console's last lines, read above).
        node.logbook.on_event(sandbox_id, record.team_id, "killed", {}, record)
        if not volumes:
            # A sandbox with volumes answers after the release: its caller may write the
            # volume, or mount it read-write elsewhere, as soon as the kill returns.
            stopped.set()

    await teardown(node, record, on_stopped=now_stopped)
    node.logbook.forget(sandbox_id)
    disk_mode.forget(node, sandbox_id)
    # Published or not as far as the record knows (long torture: a later kill answered 204).
    await paused_repo.unpublish_killed(node, sandbox_id)
    await node.store.delete(await node.store.require(sandbox_id))
    node.owners.forget_error(sandbox_id)
