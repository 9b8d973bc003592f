"""The death watch: a sandbox whose runtime dies (out of memory, a crash, a kill from outside)
is noticed within milliseconds and torn down, with the reason kept.

One loop of the node's supervisor. Every ``SYNC_S`` it lists the sandboxes that have a live
runtime — ``running``, and ``paused`` while frozen in memory — and keeps one waiter per
(sandbox, runtime pid) on ``Runtime.wait_exit`` (a pidfd: no polling of the runtime). When a
runtime exits, the record decides whether that was a death:

- still ``running`` (or frozen ``paused``) with the same runtime: **died**. The record goes to
  ``killing`` with ``last_error`` = the reason (before anything else, so the proxy refuses new
  requests at once), open streams through the proxy are aborted (the SDK's command stream
  raises instead of hanging), one WARNING line names the sandbox and the reason, a ``died``
  event keeps the reason (``Store.require`` puts it into the 404 that every later call gets),
  then ``kill`` tears down runtime, rootfs, slot and cgroups and deletes the record.
- anything else — ``killing`` (a DELETE or TTL expiry destroyed it), ``pausing`` (a spill's
  checkpoint ends the runtime), gone, or a different runtime (restored since): expected; the
  waiter ends. A death during a transitional state (a snapshot under way) is found by the next
  sync once the operation has put the record back to ``running``: ``wait_exit`` then returns
  at once.

After a server restart, recovery tears down records whose runtime died meanwhile; the watch
then re-attaches waiters to every survivor on its first sync.

Owns: its waiter tasks. Must not touch: the runtime except through ``wait_exit`` and ``kill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aenv.core.errors import AenvError
from aenv.core.states import SandboxState
from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import decode, frozen
from aenv.orchestrator.ops.kill import kill
from aenv.runtime.base import Exit, Instance
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator.deaths")

#: How often the records are listed to start waiters for new runtimes. A sandbox that dies
#: before its first sync is noticed at that sync (its ``wait_exit`` returns at once); deaths
#: of watched sandboxes are noticed at once, whatever this is.
SYNC_S = 0.5
#: The ``events`` kind that keeps why a sandbox died.
DIED_EVENT = "died"


def _watched(record: SandboxRecord) -> Instance | None:
    """The runtime whose exit would be a death of ``record``, if it has one."""
    if record.state == SandboxState.RUNNING or (
        record.state == SandboxState.PAUSED and frozen(record.instance)
    ):
        return decode(record.instance, record.sandbox_id)[1]
    return None


class DeathWatch:
    def __init__(self, node: Node) -> None:
        self.node = node
        #: sandbox id → (runtime pid, its waiter).
        self._waiters: dict[str, tuple[int | None, asyncio.Task[None]]] = {}

    def start(self) -> None:
        self.node.supervisor.spawn("death-watch", self._loop)

    async def close(self) -> None:
        """After the supervisor stopped the loop: the waiters it started end too."""
        tasks = [w for _, w in self._waiters.values()]
        for task in tasks:
            task.cancel()
        # A teardown already under way is shielded (kill) and finishes on its own.
        await asyncio.gather(*tasks, return_exceptions=True)
        self._waiters.clear()

    async def sync(self) -> None:
        """Start a waiter for every live runtime that has none (tests call it directly)."""
        records = await self.node.store.list([SandboxState.RUNNING, SandboxState.PAUSED])
        for record in records:
            instance = _watched(record)
            if instance is None:
                continue
            current = self._waiters.get(record.sandbox_id)
            if current is not None and current[0] == instance.pid and not current[1].done():
                continue
            if current is not None:
                current[1].cancel()
            task = asyncio.create_task(
                self._watch(instance), name=f"death-watch-{record.sandbox_id}"
            )
            self._waiters[record.sandbox_id] = (instance.pid, task)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                log.exception("the death watch's sync failed")
            await asyncio.sleep(SYNC_S)

    async def _watch(self, instance: Instance) -> None:
        sid = instance.sandbox_id
        try:
            exit = await self.node.runtime.wait_exit(instance)
            await self._exited(instance, exit)
        except asyncio.CancelledError:
            raise
        except AenvError as exc:
            log.warning(
                "teardown of dead sandbox %s failed (the TTL loop retries): %s", sid, exc.message
            )
        except Exception:
            log.exception("handling the exit of sandbox %s failed", sid)
        finally:
            entry = self._waiters.get(sid)
            if entry is not None and entry[1] is asyncio.current_task():
                del self._waiters[sid]

    async def _exited(self, instance: Instance, exit: Exit) -> None:
        sid = instance.sandbox_id
        record = await self.node.store.get(sid)
        if record is None:
            return
        live = _watched(record)
        if live is None or live.pid != instance.pid:
            return  # destroyed on purpose (kill, spill) or replaced (restored)
        # Proxied streams to a dead guest would hang until their client's timeout; the kill
        # aborts them first thing, and preempts whatever operation holds the sandbox.
        log.warning("sandbox %s died: %s (%d open streams)", sid, exit.message,
                    self.node.streams.count(sid))
        with contextlib.suppress(Exception):
            await self.node.store.add_event(
                sid, DIED_EVENT, {"cause": exit.cause, "message": exit.message}
            )
        await kill(self.node, sid, reason=exit.message)
