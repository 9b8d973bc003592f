"""Storage: the local layer store and per-sandbox overlay root filesystems.

``layers`` owns ``<home>/layers/`` (immutable, id-addressed layer directories); ``rootfs`` owns
the filesystem pieces of ``<home>/sandboxes/<id>/`` (upper, work, merged mount). Neither holds
global state: each is an object over one root directory. OCI images, the snapshot repository and
the bounded layer cache build on these.
"""

from aenv.storage.layers import Layer, LayerMeta, LayerStore, layer_id_for
from aenv.storage.rootfs import MountedRootfs, RootfsStore, SandboxPaths

__all__ = [
    "Layer",
    "LayerMeta",
    "LayerStore",
    "MountedRootfs",
    "RootfsStore",
    "SandboxPaths",
    "layer_id_for",
]
