"""Lifetimes, pauses, spills to disk, and the deadlines of lifecycle operations."""

from __future__ import annotations

from pydantic import Field

from aenv.core.settings.section import Section


class LifecycleSettings(Section):
    """The lifecycle: lifetimes, pauses, spills to disk, and each operation's deadlines.

    The states and the rules these times drive are in docs/lifecycle.md."""

    ttl_check_interval_s: float = Field(default=0.5, gt=0)
    """How often expired sandboxes are looked for."""

    auto_pause_default: bool = True
    """What a sandbox does at the end of its lifetime when the create request does not say
    (``autoPause``): pause (true; see the state machine in docs/architecture.md) or be killed
    (false; E2B's own default)."""

    pause_hot_s: float = Field(default=10.0, ge=0)
    """A paused sandbox stays frozen in memory this long (resume in milliseconds) before its
    memory is written to disk and freed. 0 writes it at once."""

    max_hot_paused: int = Field(default=8, ge=0)
    """At most this many sandboxes stay frozen in memory; older ones are written out first."""

    max_concurrent_spills: int = Field(default=2, ge=1)
    """At most this many frozen sandboxes are written to disk at once; the rest wait their
    turn without holding their sandbox, so a resume of one of them never waits behind a
    spill. Many checkpoints at once on a few cores each take tens of seconds (a resume that
    meets one waits for it)."""

    idle_pause_s: int | None = Field(default=None, ge=1)
    """Idle auto-pause: a running sandbox with no API call naming it and no proxied request or
    open stream for this many seconds is paused (memory kept; resumed by ``connect``, or by
    its next proxied request when created with ``autoResume``). A sandbox's own
    ``aenv.idlePauseSeconds`` metadata wins (``"0"``: never). Unset: off."""

    idle_check_interval_s: float = Field(default=1.0, gt=0)
    """How often idle sandboxes are looked for (an idle pause comes up to this late)."""

    transition_wait_s: float = Field(default=30.0, gt=0)
    """How long an operation on a sandbox (resume, connect, pause, snapshot, fork, a network
    update) waits for its turn while another operation holds the sandbox (a pause being
    written to disk, a snapshot) before answering 409."""

    operation_deadline_s: float = Field(default=300.0, gt=0)
    """The longest any one lifecycle operation on a sandbox (pause, spill, resume, snapshot,
    fork, move) may take; past it the operation is cancelled (504), and the sandbox is put
    back running or paused (docs/lifecycle.md, *The lifecycle model*)."""

    kill_answer_s: float = Field(default=3.0, gt=0)
    """A kill answers once the sandbox's processes are killed (its release goes on as the
    kill's task), or after this many seconds while the teardown goes on in the background
    (the sandbox is gone for clients either way)."""

    kill_deadline_s: float = Field(default=120.0, gt=0)
    """The longest a kill's teardown may take; a teardown past it is retried by the TTL
    loop."""
