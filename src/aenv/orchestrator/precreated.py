"""Pre-created sandboxes: network slot, rootfs and runtime processes made ahead, not started.

A restore pays ~100 ms of fixed start-up before it decodes anything (the runtime's CLI, its file
proxy, the sandbox process re-exec'ing itself, the network links; RUNTIME-NOTES). A
``Runtime.precreate`` pays it ahead; a restore into the created sandbox then takes ~95 ms
instead of ~180 ms, and 16 of them at once on 2 cores ~1.5 s instead of ~2.5 s. The pool keeps
``size`` of them for one *shape* (layers, envd bundle, CPUs, memory, disk seed: what the bundle
and rootfs of a sandbox are made of), the shape of the last fork (or, before any, the default
template's), so the next fork of that family, or a create of that template the warm pool cannot
serve, starts from one. A create from a snapshot that found none asks for the snapshot's shape
(the next sandboxes of it, an RL group's, find them; its disk image stays, so this works with
disk workspaces too); when that snapshot's image is gone the pool goes back to the default
template's shape.

A pre-created sandbox has an id already (the runtime's id of it cannot change). A fork child or
a create takes that id; a resume from disk, whose id is fixed, keeps the runtime's id as the
instance's ``runtime_id`` and takes over the pre-created sandbox's rootfs directory
(``RootfsStore.adopt``; the driver moves its bundle and logs), so it is the resumed sandbox's
from then on. That works with
memory workspaces only: with disk workspaces the rootfs is the sandbox's own disk, which the
gofer would have to bind at ``create``. For the same reason a fork child's disk there is a
clone of its parent's taken at the fork: the pool makes them on the seed a fork kept for the
parent's next one (``fork_seeds``), which that fork uses only if the parent's files did not
change in between.

How many it keeps follows demand (``pool_demand.py``): at least ``precreate_pool_size``, and
up to ``precreate_pool_max`` while a fork or a burst of creates of the last
``precreate_demand_window_s`` asked for more at once; past that the extra ones are destroyed.
The pool refills one sandbox at a time and only while no create or fork runs on the node
(``busy``): a refill competing with a fork's restores for the same cores would slow the fork.
Pre-created sandboxes have no store record: a crash leaves them as orphans, which recovery
destroys (as warm ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from aenv.core.errors import FailedPrecondition
from aenv.core.ids import new_sandbox_id
from aenv.core.net import NetSlot
from aenv.core.unwind import to_the_end
from aenv.orchestrator.context import Node
from aenv.orchestrator.deps import Template
from aenv.orchestrator.ops.boot import precreate_sandbox, release
from aenv.orchestrator.pool_demand import Demand
from aenv.runtime.base import Instance

log = logging.getLogger("aenv.orchestrator.precreated")

#: After a failed create, wait before retrying (doubling), so a broken host is not hammered.
RETRY_S = 1.0
RETRY_MAX_S = 60.0


@dataclass(frozen=True)
class Shape:
    """What a pre-created sandbox is made of; a restore may use it only for an image of a
    sandbox of exactly this shape (the restore matches the saved mounts)."""

    layers: tuple[Path, ...]
    envd_bundle: Path
    cpu_count: int
    memory_mb: int
    #: The disk image its workspace is a clone of (disk workspaces), else None.
    disk_image: Path | None


def shape(layers: Sequence[Path], envd_bundle: Path, cpu_count: int, memory_mb: int,
          disk_image: Path | None) -> Shape:
    # Real paths: a fork child's layers come from its parent's mount record, a template's
    # from the layer store, and the two must compare equal when they are the same.
    return Shape(layers=tuple(Path(os.path.realpath(p)) for p in layers),
                 envd_bundle=Path(os.path.realpath(envd_bundle)), cpu_count=cpu_count,
                 memory_mb=memory_mb, disk_image=disk_image)


def shape_of(node: Node, template: Template) -> Shape:
    return shape(template.layers, template.envd_bundle or node.envd_bundle,
                 template.cpu_count or node.settings.default_cpu_count,
                 template.memory_mb or node.settings.default_memory_mb, template.disk_image)


@dataclass(frozen=True)
class Precreated:
    sandbox_id: str
    shape: Shape
    slot: NetSlot
    instance: Instance


class PrecreatedPool:
    """Empty until :meth:`start` hands it the node and the shape to keep."""

    def __init__(self, size: int, demand: Demand | None = None) -> None:
        self._node: Node | None = None
        #: The least it keeps (0: none, and it never grows).
        self.size = size
        #: How many it keeps now: ``size``, or more while recent demand asks for more.
        self.demand = demand or Demand(floor=size, ceiling=size, window_s=0.0)
        #: The template whose shape is kept (a fork child's: the parent's layers and image).
        self._template: Template | None = None
        #: The shape kept before any ``want`` (the default template's), and after the
        #: wanted template's image or disk is gone (a deleted snapshot).
        self._default: Template | None = None
        self._ready: deque[Precreated] = deque()
        self._busy = 0
        self._wake = asyncio.Event()
        #: Sandboxes being created for the pool now (each holds a network slot).
        self.making = 0

    @property
    def node(self) -> Node:
        if self._node is None:
            raise FailedPrecondition("the pre-created pool has not started")
        return self._node

    @property
    def ready(self) -> int:
        return len(self._ready)

    async def start(self, node: Node, template: Template | None) -> None:
        self._node = node
        self._default = template
        if self._template is None:
            self._template = template
        if self.size > 0:
            node.supervisor.spawn("precreated-pool", self._fill)

    def want(self, template: Template) -> None:
        """Keep sandboxes of ``template``'s shape from now on (those of another are
        destroyed). Its disk seed, if any, must stay (a snapshot's, or the one a fork kept
        for the parent's next fork: ``fork_seeds``); once it is gone the pool goes back to
        the default template's shape."""
        if self._template is not None and self._node is not None and \
                shape_of(self.node, template) == shape_of(self.node, self._template):
            return
        self._template = template
        self._wake.set()

    def want_family(self, template: Template) -> None:
        """:meth:`want` for the next fork of a parent whose fork made ``template``: the pool
        restores nothing itself, and that fork's memory image is discarded once its children
        run, so the family is kept without it (else the pool would take it for a deleted
        snapshot's and go back to the default shape)."""
        self.want(replace(template, image=None))

    def expect(self, count: int = 1) -> None:
        """``count`` sandboxes that may restore into pre-created ones were asked for now (a
        create as it arrives, before admission spreads the starts out; a fork's children;
        a resume): the demand the pool is sized by."""
        if self.size > 0:
            self.demand.record(count)
            self._wake.set()

    def take(self, template: Template) -> Precreated | None:
        """A pre-created sandbox of ``template``'s shape, or None (then restore afresh)."""
        return self.take_shape(shape_of(self.node, template)) if self._ready else None

    def take_shape(self, shape: Shape) -> Precreated | None:
        """A pre-created sandbox of ``shape``, or None."""
        if not self._ready or self._ready[0].shape != shape:
            return None
        taken = self._ready.popleft()
        self._wake.set()
        return taken

    async def give_back(self) -> bool:
        """Destroy the newest waiting sandbox, so that its network slot serves a sandbox that
        needs one now; False if none waits. The pool refills only once the node is idle."""
        if not self._ready:
            return False
        pre = self._ready.pop()
        log.info("gave back pre-created sandbox %s: every network slot is in use",
                 pre.sandbox_id)
        await self._discard(pre)
        return True

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Inside: a create or fork runs; the pool does not refill meanwhile."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._wake.set()

    async def close(self) -> None:
        """After the supervisor stopped the refill: the ready sandboxes are destroyed."""
        # At once: a destroy waits ~1 s for the host to reap the sandbox's processes.
        ready, self._ready = list(self._ready), deque()
        if ready:
            log.info("destroying %d pre-created sandboxes", len(ready))
        await self._discard_each(ready)

    async def _fill(self) -> None:
        delay = RETRY_S
        kept = self.size
        while True:
            template = self._template
            if template is not None and template is not self._default and _gone(template):
                log.info("pre-created pool: the image of %s is gone; back to the default "
                         "template's shape", template.snapshot_id or template.template_id)
                template = self._template = self._default
            if template is not None:
                wanted = shape_of(self.node, template)
                await self._discard_other_shapes(wanted)
                target = self.demand.target()
                if target != kept:
                    log.info("pre-created pool: keeping %d (the largest demand of the last "
                             "%.0f s, at least %d)", target, self.demand.window_s, self.size)
                    kept = target
                while len(self._ready) > target:
                    await self._discard(self._ready.pop())  # the newest: made last, for it
                if self._busy == 0 and len(self._ready) < target:
                    try:
                        self._ready.append(await self._make(template, wanted))
                        delay = RETRY_S
                    except Exception as exc:
                        log.warning("pre-create failed (retrying in %.0fs): %s", delay, exc)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, RETRY_MAX_S)
                    continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                # Awake when a demand leaves the window: the pool may shrink then.
                async with asyncio.timeout(self.demand.changes_in()):
                    await self._wake.wait()

    async def _make(self, template: Template, shape: Shape) -> Precreated:
        sandbox_id = new_sandbox_id()
        self.making += 1
        try:
            slot, instance = await precreate_sandbox(self.node, sandbox_id, template)
        finally:
            self.making -= 1
        return Precreated(sandbox_id, shape, slot, instance)

    async def _discard_other_shapes(self, wanted: Shape) -> None:
        """Destroy every waiting sandbox not of ``wanted``'s shape, all at once: one after
        another, 16 of a shape a fork had just replaced held the new shape's first sandbox
        back by 3.2 s (the next wave found 8 of 16 made)."""
        stale = [p for p in self._ready if p.shape != wanted]
        if stale:
            self._ready = deque(p for p in self._ready if p.shape == wanted)
            await self._discard_each(stale)

    async def _discard_each(self, doomed: list[Precreated]) -> None:
        """Destroy ``doomed`` (already out of the queue) at once — each waits ~0.2-1 s for the
        host to reap its processes — and every one to its end; then the first failure."""
        outcomes = await asyncio.gather(*(self._discard(p) for p in doomed),
                                        return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]

    async def _discard(self, pre: Precreated) -> None:
        # To its end even when cancelled: once out of ``_ready`` nothing else would destroy
        # it (a node stopping while the pool changed shape left its runtime processes behind).
        await to_the_end(release(self.node, pre.sandbox_id, pre.slot, pre.instance))


def _gone(template: Template) -> bool:
    """Whether what sandboxes of ``template`` restore from is no longer on this node."""
    return any(p is not None and not p.exists() for p in (template.image, template.disk_image))
