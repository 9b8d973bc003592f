"""The sandbox lifecycle: states and the one table of allowed transitions.

E2B clients only ever see ``running`` or ``paused``; the transitional states exist so that two
concurrent operations on one sandbox cannot interleave (compare-and-set in the store)::

    creating ──► running ──► pausing ──► paused ──► resuming ──► running
                   │  ▲
                   │  └── snapshotting / forking (source resumes in place)
                   └──► killing ──► (gone)
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
    (S.PAUSING, S.KILLING): "found dead after a restart, with no memory image to resume",
    (S.RESUMING, S.KILLING): "found dead after a restart, with no memory image to resume",
    (S.SNAPSHOTTING, S.KILLING): "found dead after a restart",
    (S.FORKING, S.KILLING): "found dead after a restart",
}


def allowed(src: SandboxState, dst: SandboxState) -> bool:
    return (src, dst) in TRANSITIONS
