"""The node's template builder: runs builds in the background, one per template at a time.

A started build is ``waiting`` until no other build of its template runs (two builds of one
name never race: the second waits, then runs against the first's cached layers), then
``building``, then ``ready`` (its snapshot is what the template's ``default`` tag and every
tag the request named point at) or ``error`` with the step and reason. Builds of different
templates run concurrently, each in its own build sandboxes.

At start, builds a crash left ``waiting`` or ``building`` become ``error`` ("the node
restarted during the build"); their leftovers are the orphans recovery already removes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from aenv.core.errors import AenvError, FailedPrecondition
from aenv.orchestrator.build_log import BuildLog
from aenv.orchestrator.context import Node
from aenv.orchestrator.ops.build import BuildFailed, BuildSpec, execute
from aenv.store.templates import DEFAULT_TAG, BuildRecord, TemplateRecord, TemplateStore
from aenv.templates.plan import BuildPlan

log = logging.getLogger("aenv.orchestrator.builder")

RESTARTED = "the node restarted during the build"


class Builder:
    """Owns the node's template builds (one task each). Builds start once :meth:`attach`
    has handed it the node (builds run sandboxes, so they need it)."""

    def __init__(self, store: TemplateStore, *, files_dir: Path, scratch_dir: Path) -> None:
        self._node: Node | None = None
        self.store = store
        self.files_dir = files_dir
        self.scratch_dir = scratch_dir
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Tags asked for at ``POST /v3/templates``, applied when that build is started.
        self.requested_tags: dict[str, list[str]] = {}

    @property
    def node(self) -> Node:
        if self._node is None:
            raise FailedPrecondition("the template builder has not started")
        return self._node

    def attach(self, node: Node) -> None:
        self._node = node

    async def recover(self) -> int:
        """Mark builds a crash interrupted as failed; returns how many."""
        count = 0
        for build in await self.store.all_builds(["waiting", "building"]):
            if build.build_id in self._tasks:
                continue
            await self.store.set_build_status(build, "error", reason=RESTARTED)
            await self.store.append_log(build.build_id, "error", RESTARTED)
            count += 1
        return count

    def running(self, build_id: str) -> bool:
        return build_id in self._tasks

    def start(self, template: TemplateRecord, build: BuildRecord, plan: BuildPlan, *,
              tags: Sequence[str] = (), auth: tuple[str, str] | None = None) -> None:
        """Run ``plan`` as ``build`` in the background (the build must be ``waiting``)."""
        task = asyncio.create_task(self._run(template, build, plan, list(tags), auth),
                                   name=f"build-{build.build_id}")
        self._tasks[build.build_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(build.build_id, None))

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, template: TemplateRecord, build: BuildRecord, plan: BuildPlan,
                   tags: list[str], auth: tuple[str, str] | None) -> None:
        build_log = BuildLog(self.store, build.build_id)
        lock = self._locks.setdefault(template.template_id, asyncio.Lock())
        try:
            if lock.locked():
                build_log.info("waiting for the template's other build to finish")
            async with lock:
                build = await self.store.set_build_status(build, "building")
                spec = BuildSpec(
                    template_id=template.template_id, build_id=build.build_id,
                    name=template.name, cpu_count=build.cpu_count, memory_mb=build.memory_mb,
                    step_timeout_s=self.node.settings.build_step_timeout_s,
                    ready_timeout_s=self.node.settings.build_ready_timeout_s,
                    files_dir=self.files_dir, scratch_dir=self.scratch_dir,
                )
                try:
                    snapshot = await execute(self.node, plan, spec, build_log, auth=auth)
                except BuildFailed as exc:
                    build_log.line("error", exc.message, exc.step)
                    await build_log.close()
                    await self.store.set_build_status(build, "error", reason=exc.message,
                                                      reason_step=exc.step)
                    log.info("build %s of %s failed at step %s: %s", build.build_id,
                             template.name, exc.step, exc.message)
                    return
                previous = await self._default_snapshot(template.template_id)
                build = await self.store.set_build_status(build, "ready",
                                                          snapshot_id=snapshot.snapshot_id)
                for tag in {DEFAULT_TAG, *tags}:
                    await self.store.set_tag(template.template_id, tag, build.build_id)
                await self._drop_unreferenced(template.template_id, previous)
                log.info("build %s of %s ready: %s", build.build_id, template.name,
                         snapshot.snapshot_id)
        except asyncio.CancelledError:
            await asyncio.shield(self._fail(build, "the build was cancelled (node shutdown)"))
            raise
        except Exception as exc:
            message = exc.message if isinstance(exc, AenvError) else f"internal error: {exc!r}"
            log.exception("build %s of %s failed", build.build_id, template.name)
            build_log.line("error", message, "finalize")
            await self._fail(build, message)
        finally:
            await build_log.close()

    async def _fail(self, build: BuildRecord, reason: str) -> None:
        current = await self.store.get_build(build.template_id, build.build_id)
        if current is not None and current.status in ("waiting", "building"):
            await self.store.set_build_status(current, "error", reason=reason)

    async def _default_snapshot(self, template_id: str) -> str | None:
        build_id = await self.store.tagged_build(template_id, DEFAULT_TAG)
        if build_id is None:
            return None
        build = await self.store.get_build(template_id, build_id)
        return build.snapshot_id if build else None

    async def _drop_unreferenced(self, template_id: str, snapshot_id: str | None) -> None:
        """Delete the memory image of a build no tag points at any more (running sandboxes
        do not need it: a restore reads it once)."""
        if snapshot_id is None:
            return
        tagged = {b for _, b, _ in await self.store.tags(template_id)}
        for build in await self.store.builds(template_id, ["ready"]):
            if build.snapshot_id == snapshot_id and build.build_id in tagged:
                return
        if self.node.repository.get(snapshot_id) is not None:
            await self.node.repository.delete(snapshot_id)
