"""Telling a paused sandbox's write to disk from a pause, in the store's lifecycle events
(for the sandbox logs and the webhooks, ``compose/root.py`` wires it between them).

A spill (``ops/pause.py``) takes a hot-paused sandbox through ``paused → pausing → paused``:
to the store these are a pause's own transitions, and each reader would say "paused" twice
(a second ``sandbox.lifecycle.paused`` webhook for one pause). This remembers which sandboxes
entered ``pausing`` from ``paused`` and renames the event that ends it ``spill-ended`` (the
spill done, or failed and the sandbox still hot-paused: either way no new pause). Kept in
memory: a spill cut by a node's crash and finished by recovery is told as a pause.
"""

from __future__ import annotations

from typing import Any

from aenv.core.states import SandboxState

SPILL_ENDED = "spill-ended"
_PAUSING = f"state:{SandboxState.PAUSING}"


class SpillEvents:
    def __init__(self) -> None:
        self._spilling: set[str] = set()

    def kind(self, sandbox_id: str, kind: str, detail: Any) -> str:
        """The event's kind as the logs and webhooks should read it."""
        previous = detail.get("from") if isinstance(detail, dict) else None
        if kind == _PAUSING and previous == SandboxState.PAUSED:
            self._spilling.add(sandbox_id)
            return kind
        if sandbox_id in self._spilling and (kind.startswith("state:") or kind == "deleted"):
            self._spilling.discard(sandbox_id)
            if kind == f"state:{SandboxState.PAUSED}":
                return SPILL_ENDED
        return kind
