"""The task guard: a sandbox whose runtime's host tasks run away (a fork bomb) loses its
guest processes, not its life — as a VM's kernel would end a bomb, not the VM.

On the runtime's ptrace platform a guest's processes cost the host ~13 tasks each (its
traced stub threads; docs/lifecycle.md, *Fork bombs*), kept once the process is gone, and a
sandbox that reaches its host pids limit (``host_tasks_limit``) dies: a bash fork bomb got
there in ~3 s, as root or not, whatever limit the guest had of its own (envd's killer inside
the guest was starved by the bomb about half the time). So the node watches from outside:

- **Observe.** One supervised loop reads every running sandbox's host tasks
  (``Runtime.host_tasks``: one cgroup file) each ``INTERVAL_S``; a bomb grows ~600 tasks a
  second here, so it is seen within ~150 tasks of ``runaway_tasks``.
- **Decide** (:func:`runaway`): at ``runaway_tasks`` or more, and ``REGROWTH`` above what the
  sandbox was left with after its last kill (the runtime keeps those tasks, so the count never
  falls back: without the margin every round would kill again).
- **Act**, as the sandbox's operation ``stop-runaway`` (``owners.py``: never under a pause,
  snapshot or fork in flight — a busy sandbox is looked at again next round — and a kill
  preempts it): ``Runtime.kill_guest_processes`` freezes the guest, SIGKILLs every process
  but envd, and thaws it. Each command that was killed ends for its client with SIGKILL;
  envd reaps the orphans (``envd/orphans.py``) so the user can fork again at once. One
  WARNING line and a ``processes-killed`` event (host tasks before and after, processes
  killed) say what happened. A kill that fails (the socket gone, the sandbox frozen meanwhile) is
  logged and tried again after ``RETRY_S``.

What it does not stop: a sandbox that grows past ``host_tasks_limit`` between two rounds, or
whose second bomb finds the limit within reach, still dies, and its death says why
("too many processes": ``runtime/exits.py``).

Owns: the floors (in memory: a restarted node takes what each sandbox has at its first look
as its floor, so a sandbox stopped before the restart is not stopped again for it). Must not touch:
a sandbox that is not ``running`` with the instance it read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aenv.core.errors import Conflict, NotFound
from aenv.core.states import SandboxState
from aenv.orchestrator.instance_codec import decode
from aenv.runtime.base import Instance
from aenv.store.models import SandboxRecord

if TYPE_CHECKING:
    from aenv.orchestrator.context import Node

log = logging.getLogger("aenv.orchestrator.task_guard")

#: Between rounds: a bomb adds ~150 host tasks in this time here.
INTERVAL_S = 0.25
#: How often the running sandboxes are listed from the store (a round reads only cgroup
#: files): a sandbox is watched within this long of its start.
LIST_S = 1.0
#: After a kill, how many more host tasks than it left make the next one.
REGROWTH = 1024
#: How long after the kill the sandbox's host tasks are read as its floor: the dying
#: processes add some (~3 each) as they exit.
SETTLE_S = 1.0
#: The operation's name (``Owners.run``) and the event it leaves.
OPERATION = "stop-runaway"
EVENT = "processes-killed"
#: Freeze, list, signal and thaw take ~1 s for 500 processes.
DEADLINE_S = 30.0
#: After a kill that failed, how long the sandbox is left alone (one WARNING each time).
RETRY_S = 5.0


def runaway(tasks: int | None, at: int, floor: int) -> bool:
    """Are ``tasks`` host tasks a runaway, for a threshold ``at`` (0: off) and the count the
    sandbox's last kill left (0: none yet)?"""
    return at > 0 and tasks is not None and tasks >= max(at, floor + REGROWTH)


class TaskGuard:
    """The loop's state: what each sandbox was left with after its last kill."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.floors: dict[str, int] = {}
        self._running: list[tuple[SandboxRecord, Instance]] = []
        self._listed = -LIST_S
        self._started = False
        #: Sandboxes whose last kill failed, and when.
        self._failed: dict[str, float] = {}

    async def _list(self) -> list[tuple[SandboxRecord, Instance]]:
        if time.monotonic() - self._listed >= LIST_S:
            records = await self.node.store.list([SandboxState.RUNNING])
            self._listed = time.monotonic()
            self._running = [(r, i) for r in records
                             if (i := decode(r.instance, r.sandbox_id)[1]) is not None]
            live = {r.sandbox_id for r, _ in self._running}
            self.floors = {sid: n for sid, n in self.floors.items() if sid in live}
            self._failed = {sid: t for sid, t in self._failed.items() if sid in live}
            if not self._started:
                # A restarted node does not know which sandboxes were stopped before: what
                # each has now is its floor, so only new growth counts as a runaway.
                self._started = True
                for record, instance in self._running:
                    if (tasks := self.node.runtime.host_tasks(instance)) is not None:
                        self.floors[record.sandbox_id] = tasks
        return self._running

    async def check_all(self) -> None:
        """One round: every running sandbox's host tasks, and a kill for each runaway."""
        at = self.node.settings.runaway_tasks
        if at <= 0:
            return
        found: list[tuple[SandboxRecord, Instance, int]] = []
        for record, instance in await self._list():
            tasks = self.node.runtime.host_tasks(instance)
            if tasks is None or not runaway(tasks, at, self.floors.get(record.sandbox_id, 0)):
                continue
            if time.monotonic() - self._failed.get(record.sandbox_id, -RETRY_S) >= RETRY_S:
                found.append((record, instance, tasks))
        if found:
            await asyncio.gather(*(self.stop(*one) for one in found))

    async def stop(self, record: SandboxRecord, instance: Instance, tasks: int) -> None:
        """Kill the runaway sandbox's guest processes, as its operation; skipped while it is
        busy or gone."""
        sid = record.sandbox_id

        async def body() -> tuple[int, float] | None:
            now = await self.node.store.get(sid)
            if now is None or now.state != SandboxState.RUNNING or now.instance != record.instance:
                return None
            began = time.monotonic()
            killed = await self.node.runtime.kill_guest_processes(instance)
            return killed, time.monotonic() - began

        try:
            done = await self.node.owners.run(sid, OPERATION, body, wait=0, deadline=DEADLINE_S)
        except (Conflict, NotFound):
            return  # busy (looked at again next round) or being killed
        except Exception as exc:  # frozen, in doubt, the socket gone: tried again later
            self._failed[sid] = time.monotonic()
            log.warning("could not stop runaway sandbox %s (%d host tasks; again in %g s): %s",
                        sid, tasks, RETRY_S, exc)
            return
        self._failed.pop(sid, None)
        if done is None:
            return
        killed, seconds = done
        await asyncio.sleep(SETTLE_S)
        after = self.node.runtime.host_tasks(instance)
        self.floors[sid] = after if after is not None else tasks
        limit = self.node.settings.host_tasks_limit
        log.warning("sandbox %s ran away (%d host tasks of its limit of %d, a fork bomb?): "
                    "killed its %d processes but envd in %.2f s; %s host tasks after", sid,
                    tasks, limit, killed, seconds, after)
        await self.node.store.add_event(
            sid, EVENT, {"hostTasks": tasks, "hostTasksAfter": after, "limit": limit,
                         "killed": killed}, team_id=record.team_id, record=record)


async def run_task_guard_loop(node: Node) -> None:
    """The supervised loop (``compose/root.py``): a round, then ``INTERVAL_S``, forever."""
    guard = TaskGuard(node)
    while True:
        started = time.monotonic()
        try:
            await guard.check_all()
        except Exception:
            log.exception("a task guard round failed")
        await asyncio.sleep(max(0.05, INTERVAL_S - (time.monotonic() - started)))
