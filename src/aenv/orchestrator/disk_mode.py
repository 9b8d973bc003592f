"""Disk workspaces (``workspace = "disk"``): the checkpoint that takes the disk along, and
what such a node cannot do yet, in one place.

With the written files in a disk image of the sandbox's own instead of in its memory, a memory
image alone no longer holds a sandbox: it needs its disk as it was at the checkpoint instant.
:func:`checkpoint_with_disk` freezes the sandbox, clones its disk image (a reflink: no data is
copied) with the disk's filesystem frozen, checkpoints the frozen sandbox and thaws it; a fork's
children start on clones of that clone. Snapshots, template memory images and pauses another
node resumes need the disk image in the repository too (chunked by changed extents;
docs/workspaces.md): until that is built they are refused with 501 rather than half-done.
"""

from __future__ import annotations

from pathlib import Path

from aenv.core.errors import FailedPrecondition, Unimplemented
from aenv.orchestrator.context import Node
from aenv.orchestrator.disk_room import ensure_room
from aenv.orchestrator.instance_codec import decode
from aenv.orchestrator.ops.quiesce import quiesced
from aenv.runtime.base import MemoryImage
from aenv.store.models import SandboxRecord


def on_disk(node: Node) -> bool:
    return node.settings.workspace == "disk"


def refuse(node: Node, what: str) -> None:
    """Raise :class:`Unimplemented` for ``what`` on a node with disk workspaces."""
    if on_disk(node):
        raise Unimplemented(
            f"{what} of sandboxes with disk workspaces is not supported yet on this node "
            "(workspace=disk); use workspace=memory for it")


def seed_path(node: Node, name: str) -> Path:
    """Where a clone of a sandbox's disk is kept while children are made from it: on the
    pool's filesystem (reflinks do not cross filesystems), outside its top directory."""
    assert node.workspaces is not None
    directory = node.workspaces.pool.path / "clones"
    directory.mkdir(exist_ok=True)
    return directory / f"{name}.img"


async def checkpoint_with_disk(node: Node, record: SandboxRecord, dest: Path,
                               disk: Path) -> MemoryImage:
    """Checkpoint a running sandbox into ``dest`` and its disk into the clone ``disk``, both
    of one instant; the sandbox runs on.

    On failure: the sandbox runs on (thawed); neither ``dest`` nor ``disk`` is to be used.
    """
    assert node.workspaces is not None
    slot, instance = decode(record.instance, record.sandbox_id)
    if instance is None or slot is None:
        raise FailedPrecondition(f"sandbox {record.sandbox_id} has no runtime")
    ensure_room(node.runtime, instance, dest.parent,
                f"a memory image of sandbox {record.sandbox_id}")
    async with quiesced(node, record.sandbox_id, slot):
        await node.runtime.freeze(instance)
        try:
            await node.workspaces.clone_frozen(record.sandbox_id, disk)
            return await node.runtime.checkpoint(instance, dest, leave_running=True)
        except BaseException:
            disk.unlink(missing_ok=True)
            raise
        finally:
            await node.runtime.thaw(instance)
