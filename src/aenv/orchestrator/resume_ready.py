"""Sandboxes paused to disk, kept ready to resume: a runtime sandbox made ahead on their files.

A resume from disk pays the runtime's create (its CLI, the file proxy, the sandbox process
re-exec'ing itself, the network links: ~100 ms) before the restore decodes anything. With
memory workspaces a resume takes a sandbox of the pre-created pool and swaps its rootfs
directory in (``precreated.py``). With disk workspaces it cannot: the rootfs is the sandbox's
own disk, which the runtime's file proxy binds at create. So once a sandbox is on disk
(spilled, and published when there is a shared repository), the node creates a runtime
sandbox for it on that disk, in a network slot of its own, and records both in the paused
record. Its resume restores into it: the bare floor's "restore into a pre-created sandbox".

**What it costs, and the bounds**: ~12 MiB and one network slot per ready sandbox, while its
image on disk stays the sandbox. At most ``resume_ready_size`` are kept, the most recently
paused (making one gives up the oldest), each for ``resume_ready_s``; a create, fork child or
resume that finds every network slot in use takes one's slot (``ops/boot.acquire_slot``,
after the pre-created pool's). A node being drained makes none.

**States**: the record stays ``paused`` with its image; ``slot``, ``runtime_id`` and ``pid``
say it is ready (``instance_codec.ready_to_resume``). Making one and giving one up each take
the sandbox's turn as background work (skipped while another operation holds it). A kill
tears the runtime down with the rest; a failed restore into it destroys it and leaves the
sandbox paused on disk; recovery destroys it (nothing of a sandbox paused on disk runs after
a restart: ``recover.Action.ON_DISK``). The slot is recorded before the runtime is made, so a
crash in between leaks neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from aenv.core.errors import AenvError, Conflict, FailedPrecondition, NotFound
from aenv.core.net import NetSlot
from aenv.core.states import SandboxState
from aenv.core.unwind import to_the_end
from aenv.orchestrator.context import Node
from aenv.orchestrator.egress import policy_of
from aenv.orchestrator.instance_codec import (
    decode,
    envd_bundle_of,
    frozen,
    paused_image,
    ready_to_resume,
    slot_to_json,
)
from aenv.orchestrator.ops import fs_pause
from aenv.orchestrator.volumes import mounts_of
from aenv.runtime.base import Instance, SandboxSpec
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.resume_ready")

#: The record's keys that make a paused sandbox ready (dropped when it is given up).
READY_KEYS = ("slot", "runtime_id", "pid")
#: A ready sandbox due to be given up while another operation holds it: tried again then.
BUSY_RETRY_S = 5.0


def paused_spec(node: Node, record: SandboxRecord, rootfs: Path) -> SandboxSpec:
    """The runtime spec a restore of paused ``record`` must use (a restore matches the saved
    mounts: same rootfs, envd bundle and volumes as when it was saved)."""
    sid = record.sandbox_id
    return SandboxSpec(sandbox_id=sid, rootfs=rootfs,
                       envd_bundle=envd_bundle_of(record.instance, node.envd_bundle),
                       cpu_count=record.cpu_count, memory_mb=record.memory_mb,
                       volumes=node.volumes.binds(sid, mounts_of(record.volume_mounts)))


def _can_be_made_ready(record: SandboxRecord | None) -> bool:
    return (record is not None and record.state == SandboxState.PAUSED
            and paused_image(record.instance) is not None
            and not frozen(record.instance) and not ready_to_resume(record.instance)
            and not fs_pause.filesystem_only(record)
            # Its volumes are released at the spill; a resume attaches them again.
            and not record.volume_mounts)


class ResumeReady:
    """Empty until :meth:`start` hands it the node."""

    def __init__(self, size: int, keep_s: float) -> None:
        self._node: Node | None = None
        self.size = size
        self.keep_s = keep_s
        #: Sandbox id → when it was made ready (monotonic); oldest first.
        self._made: dict[str, float] = {}
        self._wake = asyncio.Event()

    @property
    def node(self) -> Node:
        if self._node is None:
            raise FailedPrecondition("the ready-to-resume sandboxes have not started")
        return self._node

    @property
    def ready(self) -> int:
        return len(self._made)

    async def start(self, node: Node) -> None:
        self._node = node
        if self.size > 0 and node.workspaces is not None:
            node.supervisor.spawn("resume-ready", self._expire)

    async def offer(self, sandbox_id: str) -> bool:
        """Make ``sandbox_id``, just written to disk, ready to resume; False when it is not
        (disabled, memory workspaces, a drain, busy, or no slot: all fine, a resume then
        creates its runtime sandbox itself)."""
        node = self.node
        if self.size <= 0 or node.workspaces is None or node.drain.on:
            return False
        for oldest in list(self._made):
            if len(self._made) < self.size:
                break
            await self.give_up(oldest)
        if len(self._made) >= self.size:
            return False  # the older ones are busy (being resumed or killed)
        try:
            made = await node.owners.run(sandbox_id, "ready", lambda: self._make(sandbox_id),
                                         wait=0)
        except (Conflict, NotFound):
            return False  # a resume or kill came first: it needs none
        except Exception as exc:
            log.warning("paused sandbox %s is not kept ready to resume: %s", sandbox_id,
                        getattr(exc, "message", None) or repr(exc),
                        exc_info=not isinstance(exc, AenvError))
            return False
        if made:
            self._made[sandbox_id] = time.monotonic()
            self._wake.set()
        return made

    def forget(self, sandbox_id: str) -> None:
        """The record no longer names a ready sandbox of ``sandbox_id`` (a resume took it,
        or a teardown destroyed it)."""
        self._made.pop(sandbox_id, None)

    async def give_back(self) -> bool:
        """Give up the oldest ready sandbox, so that its network slot serves a sandbox that
        starts now; False if none could be."""
        for sandbox_id in list(self._made):
            if await self.give_up(sandbox_id):
                log.info("gave up the ready-to-resume sandbox of %s: every network slot is "
                         "in use", sandbox_id)
                return True
        return False

    async def give_up(self, sandbox_id: str) -> bool:
        """Destroy ``sandbox_id``'s ready runtime sandbox and release its slot; it stays
        paused on disk. False when it had none, or another operation holds it (then it stays
        counted: a resume takes the ready one and a kill destroys it, each forgetting it)."""
        try:
            given = await self.node.owners.run(sandbox_id, "unready",
                                               lambda: self._unmake(sandbox_id), wait=0)
        except Conflict:
            return False
        except Exception as exc:
            log.warning("could not give up the ready-to-resume sandbox of %s: %s", sandbox_id,
                        getattr(exc, "message", None) or repr(exc),
                        exc_info=not isinstance(exc, AenvError))
            given = False
        self._made.pop(sandbox_id, None)
        return given

    async def close(self) -> None:
        """At shutdown, before the owners close: nothing of a paused sandbox keeps running."""
        for sandbox_id in list(self._made):
            await self.give_up(sandbox_id)

    async def _make(self, sandbox_id: str) -> bool:
        node = self.node
        record = await node.store.get(sandbox_id)
        if record is None or not _can_be_made_ready(record):
            return False
        slot = await node.pool.acquire(policy_of(record))
        instance: Instance | None = None
        try:
            # The slot first: a crash before the runtime is recorded then leaks no slot.
            record = await node.store.update(
                record, instance={**(record.instance or {}), "slot": slot_to_json(slot)})
            rootfs = await node.rootfs.ensure_mounted(sandbox_id)
            instance = await node.runtime.precreate(paused_spec(node, record, rootfs), slot)
            await node.store.update(record, instance={
                **(record.instance or {}), "runtime_id": instance.runtime_id,
                "pid": instance.pid})
        except BaseException:
            await to_the_end(self._release(sandbox_id, slot, instance))
            raise
        log.info("paused sandbox %s is ready to resume (slot %d)", sandbox_id, slot.index)
        return True

    async def _unmake(self, sandbox_id: str) -> bool:
        record = await self.node.store.get(sandbox_id)
        if record is None or record.state != SandboxState.PAUSED or \
                not ready_to_resume(record.instance):
            return False
        slot, instance = decode(record.instance, sandbox_id)
        assert slot is not None
        await to_the_end(self._release(sandbox_id, slot, instance))
        log.info("paused sandbox %s is no longer kept ready to resume", sandbox_id)
        return True

    async def _release(self, sandbox_id: str, slot: NetSlot, instance: Instance | None
                       ) -> None:
        """Destroy the runtime, release the slot, then drop them from the record (if it is
        still paused: a kill that took it meanwhile tears down what the record names)."""
        node = self.node
        if instance is not None:
            await node.runtime.destroy(instance)
        with contextlib.suppress(Exception):
            await node.guests.forget(slot)
        await node.pool.release(slot)
        current = await node.store.get(sandbox_id)
        if current is not None and current.state == SandboxState.PAUSED:
            await node.store.update(current, instance={
                k: v for k, v in (current.instance or {}).items() if k not in READY_KEYS})

    async def _expire(self) -> None:
        while True:
            now = time.monotonic()
            for sandbox_id, made in list(self._made.items()):
                if made + self.keep_s <= now and not await self.give_up(sandbox_id) \
                        and sandbox_id in self._made:
                    # Busy: look again a little later.
                    self._made[sandbox_id] = now - self.keep_s + BUSY_RETRY_S
            self._wake.clear()
            first = min(self._made.values(), default=None)
            timeout = None if first is None else max(0.0, first + self.keep_s - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
