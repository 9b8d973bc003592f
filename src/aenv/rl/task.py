"""A task and its *prepared state*: the one sandbox that every rollout of the task forks from.

Preparing is the expensive part of an episode (a repository checked out, dependencies
installed), so it happens once per task and pool: :func:`prepare` creates one sandbox from the
task's template, writes its files, runs its setup commands, and takes the diff baseline
(``diff.Manifest``) while nothing else touches it. Rollouts start from that sandbox (creates
from its snapshot, or forks of it: ``branch.py``); the parent itself is never changed
afterwards, which is what lets ``diff.py`` read a file's old version from it while the
rollouts run.

Prerequisites: an open :class:`~aenv.client.AsyncClient`; the template exists on the node.
On success: a :class:`Prepared` holding the running parent (labelled with the client's run, so
``aenv kill --metadata run=…`` finds it) and its manifest.
On failure: :class:`~aenv.rl.errors.SetupFailed` when a setup command exits non-zero, the
client's errors otherwise; in every case, cancellation included, the sandbox is killed before
the error propagates, so a failed prepare leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from aenv.client import AsyncClient, Sandbox
from aenv.rl.diff import Manifest, take_manifest
from aenv.rl.errors import SetupFailed

log = logging.getLogger("aenv.rl")

#: A prepared parent lives this long unless the task says otherwise: long enough for many
#: groups of rollouts; the pool kills it on exit anyway, this only bounds a crashed trainer.
PREPARED_TIMEOUT_S = 3600
#: One setup command's time limit: installs are slow, but a hung one must not hang prepare.
SETUP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Task:
    """What a rollout starts from: a template plus files and setup commands.

    ``files`` are written first (paths relative to ``workdir`` allowed), then ``setup`` runs
    in ``workdir``, one command after the other, each with ``bash -l -c``. ``prompt`` is
    what the Gym env returns as the first observation; the pool does not read it.
    ``diff_roots`` are the directories a rollout's diff covers (default: ``workdir``)."""

    template: str = "base"
    setup: tuple[str, ...] = ()
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    workdir: str = "/home/user"
    envs: Mapping[str, str] = field(default_factory=dict)
    prompt: str = ""
    diff_roots: tuple[str, ...] | None = None
    timeout_s: int = PREPARED_TIMEOUT_S
    setup_timeout_s: float = SETUP_TIMEOUT_S

    @property
    def roots(self) -> tuple[str, ...]:
        return self.diff_roots if self.diff_roots is not None else (self.workdir,)

    def path(self, path: str) -> str:
        """``path`` made absolute against the task's ``workdir``."""
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    @property
    def key(self) -> str:
        """What makes two tasks the same prepared state (the pool's cache key): everything
        that reaches the sandbox, hashed; not the prompt, which the sandbox never sees."""
        digest = hashlib.sha256()
        digest.update(json.dumps([self.template, list(self.setup), self.workdir,
                                  sorted(self.envs.items()), list(self.roots)]).encode())
        for name in sorted(self.files):
            data = self.files[name]
            digest.update(name.encode() + b"\0")
            digest.update(data.encode() if isinstance(data, str) else data)
            digest.update(b"\0")
        return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Prepared:
    """A task's prepared parent sandbox and its diff baseline (None: not taken at prepare
    time; the pool takes it when a diff first needs it, ``baseline.py``)."""

    task: Task
    sandbox: Sandbox
    manifest: Manifest | None

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.sandbox_id


#: Metadata that keeps the node's idle pause off the parent: forks and diffs need it running.
NEVER_IDLE_PAUSE = {"aenv.idlePauseSeconds": "0"}


async def prepare(client: AsyncClient, task: Task, *, labels: Mapping[str, str] | None = None,
                  manifest: bool = True) -> Prepared:
    """One sandbox of ``task``, set up, with its manifest; see the module docstring.
    ``labels``: extra metadata (the pool's); fork children inherit all of it. ``manifest``:
    False leaves the diff baseline to be taken later (hashing the roots takes seconds)."""
    sandbox = await client.create(task.template, timeout=task.timeout_s,
                                  envs=dict(task.envs) or None,
                                  metadata={**NEVER_IDLE_PAUSE, **(labels or {}),
                                            "rl_task": task.key})
    try:
        await sandbox.run(f"mkdir -p {shlex.quote(task.workdir)}", check=True)
        await asyncio.gather(*(sandbox.write_file(task.path(p), data)
                               for p, data in task.files.items()))
        for command in task.setup:
            result = await sandbox.run(command, cwd=task.workdir, timeout=task.setup_timeout_s)
            if not result.ok:
                tail = (result.stderr or result.stdout).strip()[-500:]
                raise SetupFailed(f"setup {command!r} exited {result.exit_code}"
                                  + (f": {tail}" if tail else ""), command, result,
                                  sandbox_id=sandbox.sandbox_id)
        taken = await take_manifest(sandbox, task.roots) if manifest else None
    except BaseException:
        # Shielded: a cancelled prepare must still not leave its sandbox running.
        await asyncio.shield(kill_quietly(sandbox))
        raise
    return Prepared(task, sandbox, taken)


async def kill_quietly(sandbox: Sandbox) -> None:
    """Kill ``sandbox``; a failure is logged, not raised (the run label and the sandbox's
    timeout still bound it)."""
    try:
        await sandbox.kill()
    except Exception as exc:
        log.warning("killing %s failed: %s", sandbox.sandbox_id, exc)

