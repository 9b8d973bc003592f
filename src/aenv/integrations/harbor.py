"""Harbor on aenv: each task's template built once, one prepared parent per template, a fork
child per trial.

Use: ``harbor run -p DATASET -a AGENT -e aenv.integrations.harbor:AenvEnvironment
--plugin aenv.integrations.harbor:AenvJobPlugin`` with ``E2B_API_URL``/``E2B_API_KEY`` naming
the node (``docs/integrations.md``).

This module is the Harbor-free half, importable on any Python aenv supports: the process-wide
:class:`Pool` of templates and prepared parents, and the tree transfers. It is a thin layer
over :mod:`aenv.rl`: a template's prepared parent is a prepared :class:`aenv.rl.Task` (the
template, ``/logs/{agent,verifier,artifacts}`` made in it), from ``RolloutPool.prepare``, and
each trial's sandbox comes from ``RolloutPool.fork``; what this module adds is the template
build and the batching of concurrent fork requests (the node refuses a second concurrent fork
of one parent). The two classes Harbor loads,
:class:`~aenv.integrations.harbor_env.AenvEnvironment` and ``AenvJobPlugin``, subclass
Harbor's own and live in :mod:`aenv.integrations.harbor_env`; they are reached through this
module's ``__getattr__`` (PEP 562), which imports that module, and so Harbor (Python >= 3.12),
only when they are asked for. ``import aenv.integrations.harbor`` therefore works in aenv's
3.11 venv, where the linters and type checker run, and ``module:Class`` import paths into this
module work for Harbor, which resolves them with ``getattr``.

Owns, per process and run: one :class:`~aenv.client.AsyncClient` (run label ``run=<run id>``
on every sandbox), one :class:`aenv.rl.RolloutPool` on it (label ``rl_pool=<id>``; it holds
the parents and children), one template build per template name, one prepared parent per
template, and nothing else. A template's name is ``harbor-`` + a hash of the task's
environment dir (Harbor's ``environment_id``), so equal environments share a template and a
changed one gets a new one. The job's end closes the pool (the parents, and every sandbox
labelled with it), then the client. What a crash leaves: the template (reused by the next
run); the parents and children, labelled ``run=<run id>`` and ended by the client's exit
handlers, ``aenv kill --metadata run=<run id>``, or their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shlex
import tarfile
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from e2b import AsyncTemplate

from aenv.client import AsyncClient, ClientError, Sandbox
from aenv.client.errors import CapacityError, InfrastructureError
from aenv.client.sandbox import envd_errors
from aenv.rl import RolloutPool, Task

log = logging.getLogger("aenv.integrations.harbor")

#: Harbor's own default for E2B sandboxes: a trial rarely runs an hour, a parent lives for the
#: whole job (its children are independent of it once forked).
SANDBOX_TIMEOUT_S = 3600
#: The directories Harbor's agents and verifier write to (``EnvironmentPaths``); made in the
#: parent, so every child has them before its first command.
LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
#: tar in the sandbox, for a large tree.
TAR_TIMEOUT_S = 600
_CHUNK = 1 << 20


def template_name(environment_id: str) -> str:
    """The node template of an environment (Harbor's content hash of its directory)."""
    return "harbor-" + hashlib.sha256(environment_id.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class TemplateSpec:
    """What a task's environment is built from: its directory and Dockerfile, or an image."""

    name: str
    context_dir: Path
    dockerfile: Path | None = None
    image: str | None = None

    def definition(self) -> Any:
        """The e2b SDK's template builder for it (the node builds what the SDK sends)."""
        if self.dockerfile is not None:
            return AsyncTemplate(file_context_path=str(self.context_dir)).from_dockerfile(
                str(self.dockerfile))
        if self.image is None:
            raise ValueError("a template needs a Dockerfile or an image")
        return AsyncTemplate().from_image(self.image)


@dataclass
class _Prepared:
    """A template's prepared task and the fork requests waiting for its next fork."""

    task: Task
    waiting: list[asyncio.Future[Sandbox]] = field(default_factory=list)
    #: The task serving ``waiting`` (held here: the loop keeps only a weak reference).
    forker: asyncio.Task[None] | None = None


def prepared_task(template: str, *, timeout_s: int = SANDBOX_TIMEOUT_S) -> Task:
    """The :class:`aenv.rl.Task` of a template's prepared parent: the log directories made,
    as root (the template's user may be another one: then through the sandbox's ``sudo``);
    no diff roots (Harbor's verifier scores a trial, not a diff)."""
    dirs = " ".join(LOG_DIRS)
    make = f"mkdir -p {dirs} && chmod 777 {dirs}"
    setup = f'if [ "$(id -u)" = 0 ]; then {make}; else sudo sh -c {shlex.quote(make)}; fi'
    return Task(template=template, setup=(setup,), workdir="/tmp", diff_roots=(),
                timeout_s=timeout_s)


class Pool:
    """One run's templates and :class:`aenv.rl.RolloutPool` (its prepared parents and fork
    children) on one client; shared by the run's trials.

    ``child(spec)`` is the only way in: the first call for a template builds it (or reuses
    it, when the node has it and ``force_build`` is not set) and has the rollout pool prepare
    its parent; every call forks one child from that parent. Forks asked for while one is
    under way are served together by the next (one checkpoint for many children, and a parent
    is never asked for two forks at once, which the node refuses as busy)."""

    def __init__(self, run_id: str, *, sandbox_timeout_s: int = SANDBOX_TIMEOUT_S) -> None:
        self.run_id = run_id
        self.sandbox_timeout_s = sandbox_timeout_s
        self.client = AsyncClient(run_id=run_id)
        # Forks of the running parent: each trial asks for one child when Harbor starts it
        # (no group to batch), and a trial's sandbox is documented as a fork child.
        self.rollouts = RolloutPool(self.client, rollout_timeout_s=sandbox_timeout_s,
                                    branch_from="parent")
        self._prepared: dict[str, _Prepared] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Template builds this pool ran, and templates it found on the node (for tests/logs).
        self.built: list[str] = []
        self.reused: list[str] = []

    async def child(self, spec: TemplateSpec, *, force_build: bool = False) -> Sandbox:
        prepared = await self._prepare(spec, force_build)
        future: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        prepared.waiting.append(future)
        if prepared.forker is None:
            prepared.forker = asyncio.create_task(self._fork_waiting(prepared))
        return await future

    async def kill(self, sandbox: Sandbox) -> None:
        """Kill one trial's child now (never raises: the pool logs a failed kill)."""
        await self.rollouts.kill(sandbox)

    async def _prepare(self, spec: TemplateSpec, force_build: bool) -> _Prepared:
        lock = self._locks.setdefault(spec.name, asyncio.Lock())
        async with lock:
            if spec.name in self._prepared:
                return self._prepared[spec.name]
            task = prepared_task(spec.name, timeout_s=self.sandbox_timeout_s)
            reuse = not force_build and await AsyncTemplate.exists(
                spec.name, **self._sdk_params())
            if reuse:
                try:
                    await self._start_parent(task)
                except (ClientError, OSError) as exc:
                    if isinstance(exc, CapacityError):
                        raise
                    # A template whose last build failed keeps its name: build it again.
                    log.info("template %s exists but gave no sandbox (%s): building it",
                             spec.name, exc)
                    reuse = False
            if not reuse:
                await self._build(spec, force=force_build)
                await self._start_parent(task)
            else:
                self.reused.append(spec.name)
            self._prepared[spec.name] = _Prepared(task)
            return self._prepared[spec.name]

    async def _build(self, spec: TemplateSpec, *, force: bool) -> None:
        log.info("building template %s from %s", spec.name, spec.dockerfile or spec.image)
        await AsyncTemplate.build(
            spec.definition(), spec.name, skip_cache=force,
            on_build_logs=lambda entry: log.debug("%s: %s", spec.name, entry),
            **self._sdk_params())
        self.built.append(spec.name)

    async def _start_parent(self, task: Task) -> None:
        parent = await self.rollouts.prepare(task)  # a failed prepare kills its sandbox
        log.info("template %s: prepared parent %s", task.template, parent.sandbox_id)

    async def _fork_waiting(self, prepared: _Prepared) -> None:
        """Serve the waiting fork requests, in batches, until none is left."""
        try:
            while prepared.waiting:
                batch, prepared.waiting = prepared.waiting, []
                try:
                    forked = await self.rollouts.fork(prepared.task, len(batch))
                    children, errors = list(forked), list[BaseException](forked.errors)
                except Exception as exc:
                    children, errors = [], [exc]
                for future in batch:
                    if future.cancelled():
                        continue
                    if children:
                        future.set_result(children.pop())
                    else:
                        future.set_exception(errors[0] if errors else InfrastructureError(
                            f"a fork of template {prepared.task.template}'s parent gave too "
                            "few children"))
                for orphan in children:  # asked for by a trial that was cancelled meanwhile
                    await self.rollouts.kill(orphan)
        finally:
            prepared.forker = None

    async def aclose(self) -> None:
        """Close the rollout pool (its parents, children and whatever carries its label),
        then the client (whatever else carries the run's label)."""
        self._prepared.clear()
        try:
            await self.rollouts.aclose()
        finally:
            await self.client.aclose()

    def _sdk_params(self) -> dict[str, Any]:
        config = self.client.config
        return {"api_url": config.api_url, "api_key": config.api_key,
                "sandbox_url": config.sandbox_url}


_pools: dict[str, Pool] = {}


def pool(run_id: str, *, sandbox_timeout_s: int = SANDBOX_TIMEOUT_S) -> Pool:
    """This process's pool of ``run_id`` (made on first use)."""
    if run_id not in _pools:
        _pools[run_id] = Pool(run_id, sandbox_timeout_s=sandbox_timeout_s)
    return _pools[run_id]


async def close_pools() -> None:
    """Close every pool of this process (the job's end): parents and children killed."""
    pools = list(_pools.values())
    _pools.clear()
    await asyncio.gather(*(p.aclose() for p in pools), return_exceptions=True)


# -- trees: one tar each way through envd's file API, as ``aenv cp`` does --

async def upload_tree(sbx: Sandbox, local: Path, dest: str, *, user: str = "root") -> None:
    """The contents of directory ``local`` into directory ``dest`` (made if missing)."""
    remote = f"/tmp/.aenv-harbor-{uuid.uuid4().hex}.tar"
    with tempfile.TemporaryFile() as archive:
        await asyncio.to_thread(_pack, local, archive)
        archive.seek(0)

        async def chunks() -> AsyncIterator[bytes]:
            while chunk := await asyncio.to_thread(archive.read, _CHUNK):
                yield chunk

        with envd_errors(sbx.sandbox_id, f"upload to {sbx.sandbox_id}"):
            await sbx.sdk.files.write(remote, chunks(), user=user)
    tar, target = shlex.quote(remote), shlex.quote(dest)
    await sbx.run(f"mkdir -p {target} && tar -xpf {tar} --no-same-owner -C {target}; "
                  f"rc=$?; rm -f {tar}; exit $rc", user=user, timeout=TAR_TIMEOUT_S,
                  check=True)


async def download_tree(sbx: Sandbox, src: str, local: Path, *, user: str = "root") -> None:
    """The contents of directory ``src`` into ``local`` (made if missing; files replaced)."""
    remote = f"/tmp/.aenv-harbor-{uuid.uuid4().hex}.tar"
    try:
        await sbx.run(f"tar -cf {shlex.quote(remote)} -C {shlex.quote(src)} .", user=user,
                      timeout=TAR_TIMEOUT_S, check=True)
        with tempfile.TemporaryFile() as archive:
            with envd_errors(sbx.sandbox_id, f"download from {sbx.sandbox_id}"):
                stream = await sbx.sdk.files.read(remote, format="stream", user=user)
                async with stream:
                    async for chunk in stream:
                        await asyncio.to_thread(archive.write, chunk)
            archive.seek(0)
            local.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(_unpack, archive, local)
    finally:
        with contextlib.suppress(ClientError):
            await asyncio.shield(sbx.run(f"rm -f {shlex.quote(remote)}", user=user, timeout=30))


def _pack(local: Path, archive: IO[bytes]) -> None:
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for entry in sorted(os.listdir(local)):
            tar.add(local / entry, arcname=entry)


def _unpack(archive: IO[bytes], dest: Path) -> None:
    """Extract under tarfile's ``tar`` filter (the guest is untrusted: no absolute paths, no
    ``..``, no links out of ``dest``, no devices); refused members are skipped and logged."""

    def member(info: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        mine = info.replace(uid=os.getuid(), gid=os.getgid(), uname="", gname="", deep=False)
        try:
            return tarfile.tar_filter(mine, path)
        except tarfile.FilterError as exc:
            log.warning("download: skipped %s: %s", info.name, exc)
            return None

    with tarfile.open(fileobj=archive, mode="r") as tar:
        tar.extractall(dest, filter=member)


def __getattr__(name: str) -> Any:
    """``AenvEnvironment``/``AenvJobPlugin``: imported (with Harbor) on first use."""
    if name in ("AenvEnvironment", "AenvJobPlugin"):
        try:
            from aenv.integrations import harbor_env
        except ImportError as exc:
            raise ImportError(f"aenv.integrations.harbor.{name} needs Harbor (pip install "
                              f"'harbor[e2b]', Python >= 3.12): {exc}") from exc
        return getattr(harbor_env, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
