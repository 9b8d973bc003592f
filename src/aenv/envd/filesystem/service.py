"""``filesystem.Filesystem`` Connect-RPC service (to be completed)."""

from __future__ import annotations

from aenv.envd.filesystem.watch import WatcherRegistry
from aenv.envd.state import EnvdState


class FilesystemService:
    def __init__(self, state: EnvdState, watchers: WatcherRegistry) -> None:
        self.state = state
        self.watchers = watchers
