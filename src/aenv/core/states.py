"""The sandbox lifecycle: states and the one table of allowed transitions.

E2B clients only ever see ``running`` or ``paused``; the transitional states say which
operation holds the sandbox (info reports them as ``aenv.state``)::

    creating ──► running ──► pausing ──► paused ──► resuming ──► running
                   │  ▲                    │ ▲
                   │  │                    └─┘ a frozen sandbox written to disk (spill)
                   │  └── snapshotting / forking (the source runs on in place)
                   └──► killing ──► (gone)        ◄── from every state: kill always wins

Who holds a transitional state (``orchestrator/owners.py``): exactly one owned task, the
sandbox's operation; operations on one sandbox take turns. Who may preempt whom: a kill
preempts every operation (it cancels it, writes ``killing`` and tears down once the
operation has unwound); nothing preempts a kill; a death of the runtime is a kill. Every
other operation waits for its turn (or, in the background, skips the sandbox). An operation
that ends — done, failed, past its deadline or cancelled — never leaves its transitional
state behind: the owner settles the sandbox from what the runtime and the disk show
(``orchestrator/settle.py``): ``running``, ``paused``, or gone with its reason.
"""

from __future__ import annotations

import enum


class SandboxState(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    SNAPSHOTTING = "snapshotting"
    FORKING = "forking"
    KILLING = "killing"

    @property
    def public(self) -> str:
        """What E2B's API reports: ``paused`` while paused or resuming, else ``running``."""
        return "paused" if self in (SandboxState.PAUSED, SandboxState.PAUSING) else "running"


S = SandboxState

#: (from, to) → why the edge exists.
TRANSITIONS: dict[tuple[SandboxState, SandboxState], str] = {
    (S.CREATING, S.RUNNING): "envd answered; the create is acknowledged",
    (S.CREATING, S.KILLING): "boot failed or the server restarted mid-create",
    (S.RUNNING, S.KILLING): "DELETE, TTL expiry without auto-pause, or a dead runtime",
    (S.RUNNING, S.PAUSING): "pause request or TTL expiry with auto-pause",
    (S.PAUSING, S.PAUSED): "checkpoint written; memory released",
    (S.PAUSING, S.RUNNING): "pause failed; the sandbox keeps running",
    (S.PAUSED, S.RESUMING): "connect / resume / auto-resume on traffic",
    (S.PAUSED, S.KILLING): "DELETE of a paused sandbox",
    (S.RESUMING, S.RUNNING): "restored and envd answered",
    (S.RESUMING, S.PAUSED): "resume failed; the snapshot is still there",
    (S.RUNNING, S.SNAPSHOTTING): "snapshot requested",
    (S.SNAPSHOTTING, S.RUNNING): "snapshot committed (or failed); the source runs on",
    (S.RUNNING, S.FORKING): "fork requested",
    (S.FORKING, S.RUNNING): "children started (or failed); the source runs on",
    (S.PAUSED, S.PAUSING): "a frozen sandbox's memory is written to disk",
    (S.KILLING, S.KILLING): "a kill retried after a crash",
    (S.PAUSING, S.KILLING): "a kill preempts the pause; or found dead, with no memory image",
    (S.RESUMING, S.KILLING): "a kill preempts the resume; or found dead, with no image",
    (S.SNAPSHOTTING, S.KILLING): "a kill preempts the snapshot; or found dead",
    (S.FORKING, S.KILLING): "a kill preempts the fork; or found dead",
}


def allowed(src: SandboxState, dst: SandboxState) -> bool:
    return (src, dst) in TRANSITIONS
