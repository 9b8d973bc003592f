"""What a node with disk workspaces (``workspace = "disk"``) cannot do yet, in one place.

With the written files in a disk image of the sandbox's own instead of in its memory, a memory
image alone no longer holds a sandbox: snapshots, forks, template memory images and pauses that
another node resumes need the disk image committed with it (a reflink clone at the checkpoint
instant, chunked into the repository; docs/workspaces.md). Until that is built they are refused
with 501 here rather than half-done: pause and resume on the same node, filesystem-only pauses,
creates (cold boots) and kills work.
"""

from __future__ import annotations

from aenv.core.errors import Unimplemented
from aenv.orchestrator.context import Node


def on_disk(node: Node) -> bool:
    return node.settings.workspace == "disk"


def refuse(node: Node, what: str) -> None:
    """Raise :class:`Unimplemented` for ``what`` on a node with disk workspaces."""
    if on_disk(node):
        raise Unimplemented(
            f"{what} of sandboxes with disk workspaces is not supported yet on this node "
            "(workspace=disk); use workspace=memory for it")
