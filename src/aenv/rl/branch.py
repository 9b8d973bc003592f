"""Where a task's rollouts start from: a snapshot of its prepared parent (the parent paused
meanwhile), or forks of the running parent.

``snapshot`` (the default): once prepared, the parent is snapshotted and paused; each wave's
children are creates from the snapshot. The parent costs nothing while rollouts run (before,
it ran through every wave), and a node restores creates of one snapshot into sandboxes it
made ahead in that snapshot's shape, so a wave waits on restores only (measured:
``docs/benchmarks.md``, "RL rollouts"). A diff's old side is read from the paused parent
through :class:`~aenv.rl.baseline.Baseline`, which resumes it for a read and pauses it again.

``parent``: each wave is one fork call of the running parent (what the pool did before):
children carry the parent's running processes as of each wave, not as of the prepare.

A snapshot the node refuses (an old node, a full disk) falls back to ``parent`` with a log
line: rollouts are still correct, only dearer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from aenv.client import AsyncClient, ClientError, Conflict, Forked, Sandbox
from aenv.rl.baseline import Baseline
from aenv.rl.task import Prepared, kill_quietly

log = logging.getLogger("aenv.rl")

BranchFrom = Literal["snapshot", "parent"]


@dataclass(frozen=True)
class Branch:
    """A task's prepared state and how its rollouts start from it."""

    prepared: Prepared
    #: The prepared parent's files, for diffs (paused between reads when ``snapshot_id``).
    baseline: Baseline
    #: The snapshot children are created from; None: children are forks of the parent.
    snapshot_id: str | None


async def open_branch(prepared: Prepared, how: BranchFrom) -> Branch:
    """``prepared`` ready to branch ``how``; the client's errors of the pause aside (logged:
    the parent then stays running), only a cancellation propagates."""
    def baseline(paused: bool) -> Baseline:
        return Baseline(prepared.sandbox, paused=paused, roots=prepared.task.roots,
                        manifest=prepared.manifest)

    running = Branch(prepared, baseline(False), None)
    if how == "parent":
        return running
    try:
        snapshot = await prepared.sandbox.snapshot()
    except ClientError as exc:
        log.warning("snapshot of prepared parent %s refused (%s); forking the running parent "
                    "instead", prepared.sandbox_id, exc)
        return running
    try:
        await prepared.sandbox.pause()
        paused = True
    except ClientError as exc:
        log.warning("pausing prepared parent %s failed (%s); it stays running",
                    prepared.sandbox_id, exc)
        paused = False
    return Branch(prepared, baseline(paused), snapshot.snapshot_id)


async def children(client: AsyncClient, branch: Branch, count: int, *, timeout: int,
                   metadata: Mapping[str, str]) -> Forked:
    """``count`` children of ``branch``: the ones that started, and an error for each that
    did not. Children of a snapshot carry ``metadata`` (forks inherit the parent's). If the
    call is cancelled or fails otherwise, the children it started are killed first."""
    if branch.snapshot_id is None:
        return await _forks(client, branch.prepared.sandbox_id, count, timeout=timeout)
    snapshot_id = branch.snapshot_id
    results = await asyncio.gather(
        *(client.create(snapshot_id, timeout=timeout, metadata=dict(metadata))
          for _ in range(count)), return_exceptions=True)
    started = [r for r in results if isinstance(r, Sandbox)]
    unexpected = [r for r in results
                  if isinstance(r, BaseException) and not isinstance(r, ClientError)]
    if unexpected:
        await asyncio.shield(asyncio.gather(*(kill_quietly(s) for s in started)))
        raise unexpected[0]
    return Forked(started, [r for r in results if isinstance(r, ClientError)])


async def close_branch(client: AsyncClient, branch: Branch) -> None:
    """Kill the prepared parent and delete the snapshot; failures are logged (the run label
    and the parent's timeout still bound what is left)."""
    await kill_quietly(branch.prepared.sandbox)
    if branch.snapshot_id is not None:
        try:
            await client.delete_snapshot(branch.snapshot_id)
        except ClientError as exc:
            log.warning("deleting snapshot %s of prepared parent %s failed: %s",
                        branch.snapshot_id, branch.prepared.sandbox_id, exc)


async def _forks(client: AsyncClient, parent: str, count: int, *, timeout: int) -> Forked:
    try:
        return await client.fork(parent, count, timeout=timeout)
    except Conflict:
        # Paused after all (a node-wide auto-pause, an operator): resume it, once.
        await client.resume(parent)
        return await client.fork(parent, count, timeout=timeout)
