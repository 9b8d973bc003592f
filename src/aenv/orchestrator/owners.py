"""One owner per sandbox: its lifecycle operations run one at a time, each to a deadline, and
a kill wins over all of them.

The model (docs/lifecycle.md, *The lifecycle model*; the states are ``core/states.py``'s):

- **Operations take turns.** Every operation that moves a sandbox through a transitional
  state — pause, spill, resume, snapshot, fork (of its source), a network update, a move —
  runs through :meth:`Owners.run`: it waits for the sandbox's turn (first come, first served,
  at most ``wait`` seconds, then ``Conflict`` 409; background work passes ``wait=0`` and is
  skipped while the sandbox is busy), then runs as an **owned task**.
- **The owned task is not the caller's.** A request whose client goes away does not cut the
  operation short (the caller awaits it shielded); the task belongs to this registry, which
  cancels what is left of them at shutdown.
- **Every operation has a deadline** (``operation_deadline_s``): past it the operation is
  cancelled (``DeadlineExceeded``, 504), and its own failure handling puts the sandbox back.
- **Nothing is left transitional.** When an owned task ends — done, failed, past its
  deadline or cancelled — the settler (``orchestrator/settle.py``) looks at the record while
  the turn is still held. A sandbox still in a transitional state is settled from what the
  runtime and the disk show (recovery's rule table, for one sandbox): running, paused, or gone
  with its reason, logged with the operation that left it so.
- **Kill preempts.** :meth:`Owners.begin_kill` marks the owner killed (new operations and
  queued ones get ``NotFound``) and cancels the operation in flight; the kill's teardown then
  runs as an owned task of its own once that operation has unwound (a second kill joins it).

Owns: the owned tasks (cancelled and awaited by :meth:`close`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aenv.core import telemetry
from aenv.core.errors import Conflict, DeadlineExceeded, NotFound

log = logging.getLogger("aenv.orchestrator.owners")

T = TypeVar("T")

#: How often a kill cancels again the operation it preempted while it has not unwound, and
#: after how long it logs where that operation waits.
RECANCEL_S = 1.0
STACK_AFTER_S = 5.0

#: After the operation ``name`` ended with ``failure`` (None: it succeeded), make sure the
#: sandbox is in no transitional state (``orchestrator/settle.py``).
Settler = Callable[[str, str, BaseException | None], Awaitable[None]]


@dataclass
class Owner:
    """The in-memory owner of one sandbox."""

    sandbox_id: str
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The operation holding the turn (``pause``, ``spill``, ``kill``...), since when (wall
    #: clock), and its task.
    operation: str | None = None
    since: float = 0.0
    task: asyncio.Task[Any] | None = None
    #: Set by a kill: every later operation, queued ones included, finds the sandbox gone.
    killed: bool = False
    #: Callers waiting for the turn.
    queued: int = 0


class Owners:
    def __init__(self, *, deadline_s: float = 300.0, wait_s: float = 30.0) -> None:
        self._owners: dict[str, Owner] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Kills' teardowns, which a shutdown lets finish (``close``).
        self._kills: set[asyncio.Task[Any]] = set()
        self.deadline_s = deadline_s
        self.wait_s = wait_s
        #: Set by the composition root (``settle.settle``); None: nothing is settled.
        self.settler: Settler | None = None
        #: The last operation of each sandbox that failed or was cut short, and why.
        self._errors: dict[str, str] = {}

    # -- reading -------------------------------------------------------------------------------

    def operation(self, sandbox_id: str) -> tuple[str, float] | None:
        """The operation holding the sandbox and since when (wall clock), if any."""
        owner = self._owners.get(sandbox_id)
        if owner is None or owner.operation is None:
            return None
        return owner.operation, owner.since

    def last_error(self, sandbox_id: str) -> str | None:
        return self._errors.get(sandbox_id)

    def killed(self, sandbox_id: str) -> bool:
        owner = self._owners.get(sandbox_id)
        return owner is not None and owner.killed

    def busy(self, sandbox_id: str) -> bool:
        owner = self._owners.get(sandbox_id)
        return owner is not None and (owner.turn.locked() or owner.queued > 0)

    @property
    def in_flight(self) -> int:
        return sum(1 for o in self._owners.values() if o.operation is not None)

    # -- running -------------------------------------------------------------------------------

    async def run(self, sandbox_id: str, name: str, body: Callable[[], Awaitable[T]], *,
                  wait: float | None = None, deadline: float | None = None,
                  detach: bool = True) -> T:
        """Run ``body`` as the sandbox's operation ``name`` (see the module docstring).
        ``detach=False``: a cancelled caller cancels the operation too, and waits for it to
        unwind (a fork's children, when a kill cancels the fork).

        On failure: ``NotFound`` once the sandbox is being killed, ``Conflict`` when the turn
        does not come within ``wait`` seconds (default ``wait_s``), ``DeadlineExceeded`` past
        ``deadline`` (default ``deadline_s``), else what ``body`` raised."""
        owner = self._owner(sandbox_id)
        try:
            await self._take_turn(owner, self.wait_s if wait is None else wait)
        except BaseException:
            self._drop_if_idle(owner)
            raise
        # No await between taking the turn and handing it to the task: a cancelled caller
        # cannot keep the turn.
        limit = self.deadline_s if deadline is None else deadline
        task = asyncio.create_task(self._owned(owner, name, body, limit),
                                   name=f"{name}-{sandbox_id}")
        owner.operation, owner.since, owner.task = name, time.time(), task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not detach and not task.done():
                task.cancel()
                await asyncio.wait({task})
                raise
            if task.cancelled() and not (current is not None and current.cancelling()):
                # Cancelled by a kill (or the shutdown), not by our caller: to the caller the
                # sandbox is gone, as E2B answers for a sandbox killed meanwhile.
                raise NotFound(f"sandbox {sandbox_id} was killed during its {name}") from None
            raise

    async def _take_turn(self, owner: Owner, wait: float) -> None:
        if owner.killed:
            raise NotFound(f"sandbox {owner.sandbox_id} not found")
        if owner.turn.locked() and wait <= 0:
            raise Conflict(f"sandbox {owner.sandbox_id} is busy ({owner.operation}); "
                           "try again")
        owner.queued += 1
        try:
            async with asyncio.timeout(wait):
                await owner.turn.acquire()
        except TimeoutError:
            held = f"{owner.operation} for {time.time() - owner.since:.0f} s" \
                if owner.operation else "busy"
            raise Conflict(f"sandbox {owner.sandbox_id} is busy ({held}); try again") from None
        finally:
            owner.queued -= 1
        if owner.killed:
            owner.turn.release()
            raise NotFound(f"sandbox {owner.sandbox_id} not found")

    async def _owned(self, owner: Owner, name: str, body: Callable[[], Awaitable[T]],
                     deadline: float) -> T:
        sid = owner.sandbox_id
        failure: BaseException | None = None
        began = time.monotonic()
        try:
            try:
                async with asyncio.timeout(deadline):
                    return await body()
            except TimeoutError as exc:
                raise DeadlineExceeded(
                    f"{name} of sandbox {sid} did not finish within {deadline:.0f} s") from exc
        except BaseException as exc:
            failure = exc
            if not isinstance(exc, Conflict | NotFound):
                self._errors[sid] = f"{name}: {_reason(exc)}"
            raise
        finally:
            telemetry.observe_operation(name, failure, time.monotonic() - began)
            try:
                if not owner.killed and self.settler is not None:
                    await self.settler(sid, name, failure)
            except BaseException:
                log.exception("could not settle sandbox %s after its %s", sid, name)
            finally:
                owner.operation, owner.task = None, None
                owner.turn.release()
                self._drop_if_idle(owner)

    # -- kill ----------------------------------------------------------------------------------

    def begin_kill(self, sandbox_id: str) -> asyncio.Task[Any] | None:
        """Refuse every later operation and cancel the one in flight; returns that operation's
        task (to wait for), or the kill in flight (to join)."""
        owner = self._owner(sandbox_id)
        owner.killed = True
        task = owner.task
        if task is not None and not task.done() and owner.operation != "kill":
            log.info("kill of %s preempts its %s", sandbox_id, owner.operation)
            task.cancel()
        return task

    def kill_in_flight(self, sandbox_id: str) -> asyncio.Task[Any] | None:
        owner = self._owners.get(sandbox_id)
        if owner is not None and owner.operation == "kill" and owner.task is not None:
            return owner.task
        return None

    def start_kill(self, sandbox_id: str, body: Callable[[], Awaitable[None]], *,
                   deadline: float) -> asyncio.Task[None]:
        """The kill's teardown as the sandbox's owned task: it takes the turn as soon as the
        preempted operation (if any) lets go of it, ahead of everything queued (they find the
        sandbox killed)."""
        owner = self._owner(sandbox_id)
        owner.killed = True

        async def whole() -> None:
            await self._turn_for_kill(owner)
            owner.operation, owner.since = "kill", time.time()
            owner.task = asyncio.current_task()
            began, failure = time.monotonic(), None
            try:
                try:
                    async with asyncio.timeout(deadline):
                        await body()
                except TimeoutError as exc:
                    raise DeadlineExceeded(f"kill of sandbox {sandbox_id} did not finish "
                                           f"within {deadline:.0f} s") from exc
            except BaseException as exc:
                failure = exc
                raise
            finally:
                telemetry.observe_operation("kill", failure, time.monotonic() - began)
                owner.operation, owner.task = None, None
                owner.turn.release()
                # Killed or not (a failed teardown leaves a ``killing`` record that the TTL
                # loop retries, with a fresh owner), nothing more of this owner is needed.
                owner.killed = False
                self._drop_if_idle(owner)

        task = asyncio.create_task(whole(), name=f"kill-{sandbox_id}")
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        task.add_done_callback(_log_failed_kill)
        return task

    async def _turn_for_kill(self, owner: Owner) -> None:
        """The turn, once the preempted operation lets go of it. A cancel can be lost (one
        that lands as the awaited call ends is taken for that call's result) or the
        operation may cancel a step and go on to the next: it is cancelled again every
        ``RECANCEL_S`` until it ends, and where it waits is logged once."""
        waited, told = 0.0, False
        while True:
            try:
                async with asyncio.timeout(RECANCEL_S):
                    await owner.turn.acquire()
                return
            except TimeoutError:
                waited += RECANCEL_S
            holder = owner.task
            if holder is None or holder.done() or owner.operation == "kill":
                continue
            if not told and waited >= STACK_AFTER_S:
                told = True
                log.warning("kill of %s waits %.0f s for its %s to unwind; it is at:\n%s",
                            owner.sandbox_id, waited, owner.operation, _where(holder))
            holder.cancel()

    # -- lifetime ------------------------------------------------------------------------------

    async def finish_kills(self, *, wait_s: float = 20.0) -> None:
        """Wait (at most ``wait_s``) for the kills in flight: a kill answers once its sandbox
        is stopped and releases the rest afterwards, so at shutdown its release is to end
        while what it releases into (network pool, store, repository) is still open."""
        kills = list(self._kills)
        if kills:
            log.info("waiting for %d kills to finish their release", len(kills))
            await asyncio.wait(kills, timeout=wait_s)

    async def close(self, *, kill_wait_s: float = 30.0) -> None:
        """Cancel every owned operation and wait for them (server shutdown: recovery finishes
        what they leave at the next start). Kills are not cancelled: a kill that answered
        early (``kill_answer_s``) must not leave its sandbox's processes behind; they get
        ``kill_wait_s`` to finish, and what is still unfinished then is recovery's."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        kills = list(self._kills)
        if kills:
            _, late = await asyncio.wait(kills, timeout=kill_wait_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*kills, return_exceptions=True)

    def forget_error(self, sandbox_id: str) -> None:
        self._errors.pop(sandbox_id, None)

    def _owner(self, sandbox_id: str) -> Owner:
        owner = self._owners.get(sandbox_id)
        if owner is None:
            owner = self._owners[sandbox_id] = Owner(sandbox_id)
        return owner

    def _drop_if_idle(self, owner: Owner) -> None:
        # An owner holds nothing between operations except ``killed``, which matters only
        # until the kill's task has the turn.
        if owner.operation is None and owner.queued == 0 and not owner.turn.locked() \
                and not owner.killed and self._owners.get(owner.sandbox_id) is owner:
            del self._owners[owner.sandbox_id]


def _where(task: asyncio.Task[Any]) -> str:
    """Where ``task`` waits: its chain of awaited coroutines, one line each (``get_stack``
    gives only the outermost frame of a suspended coroutine)."""
    lines: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(lines) < 40:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            lines.append(f"  awaiting {awaited!r:.200}")
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines) or "  (no frames)"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


def _log_failed_kill(task: asyncio.Task[None]) -> None:
    """A kill that answered early may fail later with nobody awaiting it: say so here (its
    ``killing`` record is retried by the TTL loop), rather than as asyncio's "never
    retrieved"."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("%s failed (the TTL loop tries again): %s", task.get_name(),
                    getattr(exc, "message", None) or repr(exc))
