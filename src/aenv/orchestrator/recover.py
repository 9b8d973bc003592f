"""Crash recovery: make the store and the machine agree again after a restart.

Three phases (STYLE §14): *observe* what the runtime and the disk have, *plan* with a pure
function, then *apply*. The rule: every sandbox ends up ``running`` or ``paused`` if anything
of it survives (a live runtime, or a complete memory image), and is torn down otherwise.

- running / snapshotting / forking, runtime alive: running (thawed if frozen).
- paused and frozen, alive: paused and frozen; its spill is scheduled again.
- paused on disk: paused (the image is kept).
- pausing with a complete image: paused on disk (a save that finished leaves its sentry
  paused, never to be thawed); else alive and frozen (or flagged): paused and frozen; alive
  and running: running (the pause never answered).
- resuming by thaw, alive: running; from disk with the image still there: paused (the
  restore's runtime is torn down).
- creating, killing, and anything with neither a runtime nor an image: torn down.
- alive but "in doubt" (a freeze or thaw over the control socket cut short, so the driver
  cannot tell whether it is paused): written to disk at once and paused there. A checkpoint
  is right in either case; a thaw of a sandbox that is not frozen would kill it.

A runtime sandbox no record knows (a warm one, a create that never got its record) is
destroyed; a memory image no paused record names is deleted.

Recovery never stops the node. A record it cannot read (a JSON column that does not parse, an
instance of the wrong shape) is torn down. Each sandbox is applied on its own: when
re-attaching, thawing, re-mounting, writing to disk or tearing down one sandbox fails, that
sandbox is marked ``killing`` with the reason in ``last_error``, and everything of it is
released step by step (each step on its own, "already gone" counting as done); its record is
deleted once nothing is left, else it stays ``killing`` (invisible to clients) and the next
start tries again. The other sandboxes, and start-up, go on.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import shutil
import time
from dataclasses import dataclass, field

from aenv.core.states import SandboxState
from aenv.orchestrator import paused_repo
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import policy_of
from aenv.orchestrator.instance_codec import decode, frozen, paused_image
from aenv.orchestrator.ops.fs_pause import filesystem_only
from aenv.orchestrator.ops.pause import image_dir, spill
from aenv.orchestrator.ops.teardown import teardown
from aenv.runtime.base import Instance, Observed
from aenv.store.models import UNREADABLE, SandboxRecord

log = logging.getLogger("aenv.orchestrator.recover")

S = SandboxState
#: How long recovery waits for a save a crash interrupted to finish (a save takes < 1 s for
#: a small sandbox, seconds for a large one).
SAVE_WAIT_S = 60.0


class Action(enum.Enum):
    RUNNING = "running"            # re-attach as running (thaw if frozen)
    FROZEN = "frozen"              # re-attach as paused in memory
    ON_DISK = "on-disk"            # paused, memory image on disk; nothing runs
    BACK_TO_DISK = "back-to-disk"  # a resume from disk never finished: drop its runtime
    SPILL = "spill"                # alive, paused or not: write it to disk now
    FILES = "files"                # paused filesystem-only: nothing runs, the files are kept
    TEARDOWN = "teardown"


@dataclass
class Plan:
    actions: dict[str, Action] = field(default_factory=dict)
    orphans: list[Observed] = field(default_factory=list)
    #: Filled by ``recover``: sandboxes whose action failed (torn down instead) → why.
    failed: dict[str, str] = field(default_factory=dict)

    def of(self, action: Action) -> list[str]:
        return [sid for sid, a in self.actions.items() if a == action]

    @property
    def reattach(self) -> list[str]:
        return self.of(Action.RUNNING) + self.of(Action.FROZEN) + self.of(Action.SPILL)

    @property
    def teardown(self) -> list[str]:
        return self.of(Action.TEARDOWN)


def unreadable(record: SandboxRecord) -> str | None:
    """Why recovery cannot make sense of ``record``'s runtime data, or ``None``; pure."""
    if record.last_error and record.last_error.startswith(UNREADABLE):
        return record.last_error  # the store could not parse a column of the row
    try:
        if record.instance is not None and not isinstance(record.instance, dict):
            raise TypeError(f"a {type(record.instance).__name__}, not an object")
        decode(record.instance, record.sandbox_id)
        frozen(record.instance)
        paused_image(record.instance)
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        return f"{UNREADABLE} instance: {exc}"
    return None


def decide(record: SandboxRecord, observed: Observed | None, image_complete: bool) -> Action:
    """The one rule table (see the module docstring); pure."""
    if unreadable(record) is not None:
        return Action.TEARDOWN
    alive = observed is not None and observed.status in (
        "running", "created", "paused", "in-doubt")
    state = record.state
    in_doubt = observed is not None and observed.status == "in-doubt"
    if in_doubt and state not in (S.CREATING, S.KILLING) and not (
            state == S.PAUSING and image_complete):
        return Action.SPILL
    if state in (S.PAUSED, S.PAUSING, S.RESUMING) and filesystem_only(record):
        # A pause that kept only the files (ops/fs_pause.py): they are the sandbox. A pause
        # whose runtime still lives never got as far as destroying it; a reboot cut short is
        # undone (its envd may not have the sandbox's token yet).
        return Action.RUNNING if alive and state == S.PAUSING else Action.FILES
    if state in (S.RUNNING, S.SNAPSHOTTING, S.FORKING):
        return Action.RUNNING if alive else Action.TEARDOWN
    if state == S.PAUSED:
        if frozen(record.instance):
            return Action.FROZEN if alive else Action.TEARDOWN
        return Action.ON_DISK if image_complete else Action.TEARDOWN
    if state == S.PAUSING:
        if image_complete:
            # The spill's save finished: the image is the sandbox. The saved sentry lingers
            # (paused) after a save without --leave-running and must never be thawed.
            return Action.ON_DISK
        if alive:
            flagged = frozen(record.instance) or (observed is not None
                                                  and observed.status == "paused")
            return Action.FROZEN if flagged else Action.RUNNING
        return Action.TEARDOWN
    if state == S.RESUMING:
        if frozen(record.instance):
            return Action.RUNNING if alive else Action.TEARDOWN
        return Action.BACK_TO_DISK if image_complete else (
            Action.RUNNING if alive else Action.TEARDOWN)
    return Action.TEARDOWN


def plan(records: list[SandboxRecord], observed: list[Observed],
         complete_images: set[str]) -> Plan:
    by_id = {o.sandbox_id: o for o in observed}
    result = Plan()
    for record in records:
        result.actions[record.sandbox_id] = decide(
            record, by_id.get(record.sandbox_id), record.sandbox_id in complete_images
        )
    known = {r.sandbox_id for r in records}
    result.orphans = [o for o in observed if o.sandbox_id not in known]
    return result


def find_images(node: Node, records: list[SandboxRecord]) -> set[str]:
    """Sandboxes with a complete memory image on disk. A ``.partial`` image of a sandbox
    whose checkpoint finished (the runtime wrote every file and the sandbox exited) but whose
    rename did not happen is completed here."""
    found = set()
    for record in records:
        if unreadable(record) is not None:
            continue
        try:
            final = paused_image(record.instance) or image_dir(node, record.sandbox_id)
            partial = final.with_name(final.name + ".partial")
            if not final.exists() and partial.exists() and node.runtime.image_complete(partial):
                partial.rename(final)
            if final.exists() and node.runtime.image_complete(final):
                found.add(record.sandbox_id)
        except OSError as exc:
            log.warning("cannot read the memory image of %s: %s", record.sandbox_id, exc)
    return found


async def _finish_saves(node: Node, records: list[SandboxRecord]) -> bool:
    """A spill cut short by a crash goes on without us: the runtime's checkpoint process
    outlives the server and keeps writing. Wait until no such process is left, so
    an image is judged complete or not only once nothing writes it. True if any was waited
    for."""
    pausing = {r.sandbox_id for r in records if r.state == S.PAUSING}
    deadline = time.monotonic() + SAVE_WAIT_S
    waited = False
    while pausing and time.monotonic() < deadline:
        if not node.runtime.saving(pausing):
            break
        waited = True
        await asyncio.sleep(0.05)
    return waited


async def recover(node: Node) -> Plan:
    """Observe, plan, apply (see the module docstring).

    Prerequisites: the store is open, the network pool started, nothing else runs on the node.
    On success: every record is re-attached or gone (or, if its clean-up failed, ``killing``
    with ``last_error``); orphans, stray rootfs and stray images are removed.
    On failure: raises only when the runtime or the store cannot be read at all; a failure of
    one sandbox is logged and handled as above.
    """
    records = await node.store.list()
    observed = await node.runtime.observe()
    if await _finish_saves(node, records):
        observed = await node.runtime.observe()
    todo = plan(records, observed, find_images(node, records))
    by_id = {r.sandbox_id: r for r in records}
    live = {o.sandbox_id: o for o in observed}
    failed = todo.failed
    for sandbox_id, action in todo.actions.items():
        record = by_id[sandbox_id]
        try:
            await apply(node, record, action, live.get(sandbox_id))
        except Exception as exc:
            log.exception("could not recover %s (%s)", sandbox_id, action.value)
            failed[sandbox_id] = f"recovery failed ({action.value}): {_reason(exc)}"
            await give_up(node, sandbox_id, live.get(sandbox_id), failed[sandbox_id])
    for orphan in todo.orphans:
        log.info("destroying orphan runtime sandbox %s", orphan.runtime_id)
        try:
            await node.runtime.destroy(Instance(orphan.sandbox_id, orphan.runtime_id,
                                                orphan.pid, None))
        except Exception:
            log.exception("could not destroy orphan runtime sandbox %s", orphan.runtime_id)
    kept = {sid for sid, a in todo.actions.items() if a != Action.TEARDOWN} - set(failed)
    for sandbox_id in node.rootfs.sandbox_ids():
        if sandbox_id not in kept:
            # A warm sandbox, a create that never got its record, a torn-down one.
            try:
                await node.rootfs.disassemble(sandbox_id, keep_upper=False, lazy=True)
            except Exception:
                log.exception("could not remove the rootfs of %s", sandbox_id)
    _remove_stray_images(node, (set(todo.of(Action.ON_DISK)) | set(todo.of(Action.BACK_TO_DISK))
                                | set(todo.of(Action.SPILL))) - set(failed))
    return todo


def _reason(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


async def give_up(node: Node, sandbox_id: str, observed: Observed | None, reason: str) -> None:
    """Release everything of a sandbox recovery could not restore; never raises.

    The record goes to ``killing`` with ``reason`` in ``last_error`` first, so a crash during
    the clean-up leaves it to the next start's teardown; it is deleted once everything of it is
    released.
    """
    try:
        record = await node.store.get(sandbox_id)
        if record is None:
            return
        record = await node.store.update(record, state=S.KILLING, last_error=reason)
        if unreadable(record) is not None:
            # What the record says cannot be trusted: release by id and by what the runtime shows;
            # the slot, unadopted, goes with the pool's sweep.
            record = await node.store.update(record, instance=None)
        stuck: Exception | None = None
        if observed is not None:
            try:
                await node.runtime.destroy(Instance(sandbox_id, observed.runtime_id,
                                                    observed.pid, None))
            except Exception as exc:
                stuck = exc  # the rest is released all the same; the record stays
        await teardown(node, record, lazy=True)
        if stuck is not None:
            raise stuck
        await node.store.delete(record)
        log.warning("sandbox %s is gone: %s", sandbox_id, reason)
    except Exception:
        log.exception("could not clean up sandbox %s (%s); it stays killing for the next start",
                      sandbox_id, reason)


async def apply(node: Node, record: SandboxRecord, action: Action,
                 observed: Observed | None, *, live: bool = False) -> None:
    """``live``: on a serving node (``settle.py``), whose pool leases the slot already and
    whose spiller writes a sandbox to disk (the caller holds the sandbox's turn)."""
    sid = record.sandbox_id
    if action == Action.TEARDOWN and (why := unreadable(record)) is not None:
        await give_up(node, sid, observed, why)  # nothing of it can be trusted: by id
        return
    slot, instance = decode(record.instance, sid)
    if action == Action.TEARDOWN:
        log.info("tearing down sandbox %s left %s by a previous run", sid, record.state)
        killed = record.state == S.KILLING
        if not killed:
            record = await node.store.update(record, state=S.KILLING)
        if instance is None:
            # A create (a fork child) or a resume cut short before its record named its
            # runtime: what the driver has of it goes by id, seen running or not (torture: a
            # kill preempting a cold resume, then SIGKILL, left the runtime's directory).
            await node.runtime.destroy(Instance(
                sid, observed.runtime_id if observed is not None else sid,
                observed.pid if observed is not None else None, slot))
        await teardown(node, record)
        if killed:
            # A kill the crash cut short finishes as the kill would have (torture: a kill
            # preempting a resume, then SIGKILL; its paused manifest answered the next kill).
            await paused_repo.unpublish_killed(node, sid)
        await node.store.delete(record)
        return
    if action in (Action.RUNNING, Action.FROZEN, Action.SPILL):
        if instance is None and observed is not None and slot is not None:
            instance = Instance(sid, observed.runtime_id, observed.pid, slot)
        if slot is not None and not live:
            await node.pool.adopt(slot, policy_of(record))
        await node.rootfs.ensure_mounted(sid)
        data = dict(record.instance or {})
        if instance is not None:
            data.update(runtime_id=instance.runtime_id, pid=instance.pid)
        data.pop("image", None)
        if action == Action.RUNNING:
            if observed is not None and observed.status == "paused" and instance is not None:
                await node.runtime.thaw(instance)
            data.pop("frozen", None)
            if record.state != S.RUNNING or data != (record.instance or {}):
                await node.store.update(record, state=S.RUNNING, instance=data)
        else:
            if action == Action.FROZEN and observed is not None and (
                    observed.status != "paused" and instance is not None):
                await node.runtime.freeze(instance)
            data["frozen"] = True
            if action == Action.SPILL:  # the way the state machine goes to "paused"
                if record.state in (S.SNAPSHOTTING, S.FORKING):
                    record = await node.store.update(record, state=S.RUNNING)
                if record.state == S.RUNNING:
                    record = await node.store.update(record, state=S.PAUSING)
            if record.state != S.PAUSED or data != (record.instance or {}):
                await node.store.update(record, state=S.PAUSED, instance=data)
            if action == Action.SPILL and live:
                node.spiller.schedule(sid, delay=0.0)
                return
            if action == Action.SPILL:
                log.info("sandbox %s was cut short in a pause or resume: writing it to disk",
                         sid)
                try:
                    await spill(node, sid)
                except Exception:
                    log.exception("could not write %s to disk; the spiller tries again", sid)
                    node.spiller.schedule(sid)
                return
            node.spiller.schedule(sid)
        log.info("re-attached sandbox %s (%s)", sid, action.value)
        return
    if action == Action.FILES:
        if instance is not None or observed is not None:
            runtime_id = instance.runtime_id if instance else observed.runtime_id  # type: ignore[union-attr]
            await node.runtime.destroy(Instance(sid, runtime_id, None, None))
        if slot is not None:
            await node.pool.release(slot)
        await node.rootfs.disassemble(sid, keep_upper=True, lazy=True)
        data = {k: v for k, v in (record.instance or {}).items() if k == "envd_bundle"}
        data["filesystem"] = True
        if record.state != S.PAUSED or data != (record.instance or {}):
            await node.store.update(record, state=S.PAUSED, instance=data)
        log.info("sandbox %s is paused, files only", sid)
        return
    # ON_DISK / BACK_TO_DISK: nothing may run; the image is the sandbox.
    if instance is not None or observed is not None:
        runtime_id = instance.runtime_id if instance else observed.runtime_id  # type: ignore[union-attr]
        await node.runtime.destroy(Instance(sid, runtime_id, None, None))
    if slot is not None:
        await node.pool.release(slot)
    await node.rootfs.ensure_mounted(sid)
    data = {k: v for k, v in (record.instance or {}).items() if k == "envd_bundle"}
    data["image"] = str(paused_image(record.instance) or image_dir(node, sid))
    if record.state != S.PAUSED or data != (record.instance or {}):
        await node.store.update(record, state=S.PAUSED, instance=data)
    log.info("sandbox %s is paused on disk", sid)


def _remove_stray_images(node: Node, keep: set[str]) -> None:
    if not node.paused_dir.is_dir():
        return
    for entry in node.paused_dir.iterdir():
        sandbox_id = entry.name.removesuffix(".partial")
        if sandbox_id not in keep or entry.name.endswith(".partial"):
            log.info("removing stray memory image %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
