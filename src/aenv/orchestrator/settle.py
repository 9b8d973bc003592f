"""Settle a sandbox that an operation left in a transitional state.

Called by the sandbox's owner (``owners.py``) in the operation's task, while its turn is
still held, after every operation — so no sandbox stays ``pausing``, ``resuming``,
``snapshotting`` or ``forking`` without a task that holds it. Usually the operation put the
record back itself and there is nothing to do (one cached read). Otherwise the sandbox is
settled as a restart would settle it (``recover.py``'s rule table, for one sandbox, from
what the runtime and the disk show now): ``running``, ``paused`` (frozen, on disk, or files
only), or — when nothing of it can run again — gone, its reason kept for the 404 and logged
with the operation and the error that left it so.

``creating`` is the create's own (a failed create abandons its record) and ``killing`` the
kill's (a failed kill is retried by the TTL loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aenv.core.errors import Conflict
from aenv.core.states import SandboxState
from aenv.orchestrator import recover
from aenv.orchestrator.context import Node
from aenv.orchestrator.deaths import DIED_EVENT
from aenv.runtime.base import Observed

log = logging.getLogger("aenv.orchestrator.settle")

S = SandboxState
#: The states an operation holds and must give back.
HELD = frozenset({S.PAUSING, S.RESUMING, S.SNAPSHOTTING, S.FORKING})
#: Reads and decisions before a record that keeps changing is given up.
_ATTEMPTS = 5


async def settle(node: Node, sandbox_id: str, operation: str,
                 failure: BaseException | None) -> None:
    why = _reason(failure)
    observed: Observed | None = None
    for _ in range(_ATTEMPTS):
        record = await node.store.get(sandbox_id)
        if record is None or record.state not in HELD:
            return
        observed = next((o for o in await node.runtime.observe()
                         if o.sandbox_id == sandbox_id), None)
        images = await asyncio.to_thread(recover.find_images, node, [record])
        action = recover.decide(record, observed, sandbox_id in images)
        log.warning("the %s of %s left it %s (%s): settled as %s", operation, sandbox_id,
                    record.state, why, action.value)
        if action == recover.Action.TEARDOWN:
            await _gone(node, sandbox_id, observed,
                        f"lost in its {operation} ({why}): nothing of it could run again")
            return
        try:
            await recover.apply(node, record, action, observed, live=True)
            return
        except Conflict:
            # Someone wrote the record meanwhile (a kill marking it, the end time): look
            # again; what they wrote may have settled it already.
            await asyncio.sleep(0.05)
        except Exception as exc:
            log.exception("could not settle %s as %s", sandbox_id, action.value)
            await _gone(node, sandbox_id, observed,
                        f"lost in its {operation} ({why}); settling it failed: "
                        f"{getattr(exc, 'message', exc)}")
            return
    # Never left in a state no task holds: what it cannot be settled as, it is gone as.
    log.error("could not settle %s: its record kept changing", sandbox_id)
    await _gone(node, sandbox_id, observed, f"lost in its {operation} ({why}); its record kept "
                "changing while it was settled")


async def _gone(node: Node, sandbox_id: str, observed: object, reason: str) -> None:
    node.streams.abort(sandbox_id)
    with contextlib.suppress(Exception):
        await node.store.add_event(sandbox_id, DIED_EVENT, {"cause": "lifecycle",
                                                            "message": reason})
    await recover.give_up(node, sandbox_id, observed, reason)  # type: ignore[arg-type]


def _reason(failure: BaseException | None) -> str:
    if failure is None:
        return "it returned without giving the sandbox back"
    if isinstance(failure, asyncio.CancelledError):
        return "cancelled"
    return getattr(failure, "message", None) or str(failure) or type(failure).__name__
