"""Release everything a sandbox holds: runtime, rootfs, network slot, paused memory image.
Idempotent.

Used by kill, failed creates and recovery; each step tolerates "already gone" (a mount that is
not mounted, a netns or veth that no longer exists, a directory already removed: all count as
removed), and each step runs even when an earlier one failed, so one stuck piece does not keep
the others alive. The first failure is raised at the end; calling again retries what is left.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable

from aenv.orchestrator.context import Node
from aenv.orchestrator.instance_codec import decode
from aenv.store.models import SandboxRecord

log = logging.getLogger("aenv.orchestrator")


async def teardown(node: Node, record: SandboxRecord, *, lazy: bool = False,
                   on_stopped: Callable[[], None] | None = None) -> None:
    """``lazy``: detach a busy rootfs instead of failing (recovery, where a runtime that would
    not die must not keep the sandbox's files mounted forever). ``on_stopped`` is called once
    the sandbox's processes are killed, before anything is released (a kill answers then)."""
    sid = record.sandbox_id
    slot, instance = decode(record.instance, sid)
    node.streams.abort(sid)
    if instance is not None:
        try:
            await node.runtime.stop(instance)
        except Exception as exc:  # destroy, next, kills it the slow way
            log.warning("teardown of %s: could not stop it at once: %s", sid, exc)
    if on_stopped is not None:
        on_stopped()
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
    if instance is not None:
        steps.append(("runtime", lambda: node.runtime.destroy(instance)))
    steps.append(("rootfs", lambda: node.rootfs.disassemble(sid, keep_upper=False, lazy=lazy)))
    if slot is not None:
        steps.append(("guest connection", lambda: node.guests.forget(slot)))
        steps.append(("network slot", lambda: node.pool.release(slot)))
    first: Exception | None = None
    runtime_left = False
    took: list[str] = []
    for what, step in steps:
        started = time.perf_counter()
        try:
            await step()
            took.append(f"{what} {(time.perf_counter() - started) * 1000:.0f}")
        except Exception as exc:
            log.warning("teardown of %s: could not release its %s: %s", sid, what,
                        getattr(exc, "message", exc))
            first = first or exc
            runtime_left = runtime_left or what == "runtime"
    if not runtime_left:
        # Its volumes are free once nothing of it can write them any more.
        try:
            await node.volumes.detach(sid)
        except Exception as exc:
            log.warning("teardown of %s: could not release its volumes: %s", sid,
                        getattr(exc, "message", exc))
            first = first or exc
    node.spiller.cancel(sid)
    node.resume_ready.forget(sid)
    image = node.paused_dir / sid
    for path in (image, image.with_name(image.name + ".partial")):
        await asyncio.to_thread(shutil.rmtree, path, True)
    log.debug("teardown of %s (ms): %s", sid, ", ".join(took))
    if first is not None:
        raise first
